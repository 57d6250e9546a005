//! Rebuild the eBPF object when `bpf-linker` changes: cargo does not know the
//! linker is an input. Missing linker: say how to get it.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!("cargo:warning=bpf-linker not on PATH; run `cargo xtask setup`"),
    }
}
