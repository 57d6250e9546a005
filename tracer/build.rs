//! Builds the eBPF programs (`tracer-ebpf`) for the bpf target with the
//! nightly toolchain, so `cargo build` of the tracer is the only command.
fn main() -> anyhow::Result<()> {
    let package = aya_build::Package {
        name: "tracer-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
