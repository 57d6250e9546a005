//! Any bytes as a capture file: the reader ends in packets, our traces'
//! kernel records and counters, a clean end or an error with an offset
//! inside the file, never a panic, a hang or an allocation beyond what the
//! file could hold.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::source::capture::{segment, CaptureReader, Item};

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = CaptureReader::new(data) else {
        return;
    };
    while let Some(item) = reader.next_item() {
        match item {
            Ok(Item::Packet(p)) => {
                assert!(p.offset < data.len() as u64);
                let _ = segment(&p);
            }
            Ok(_) => {}
            Err(e) => {
                assert!(e.offset <= data.len() as u64, "{e}");
                break;
            }
        }
    }
});
