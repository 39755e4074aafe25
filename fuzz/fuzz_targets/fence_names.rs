//! An initiator name as a login carries it, read by the write fence for the cycle it
//! names (`backstore::role::writer_and_cycle`): nothing may panic; a name read as a cycle
//! writer's is the writer's name with that cycle's tag (as `cycle_writer` makes it, the hex
//! digits in any case), and the cycle rule admits a tagged stream only in its own cycle.
#![no_main]

use backstore::role::{cycle_writer, writer_and_cycle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&open, name)) = input.split_first() else {
        return;
    };
    let name = String::from_utf8_lossy(name);
    let (writer, cycle) = writer_and_cycle(&name);
    match cycle {
        None => assert_eq!(writer, &*name),
        Some(c) => {
            assert!(cycle_writer(writer, c).eq_ignore_ascii_case(&name));
            let open = u64::from(open);
            assert_eq!(scsi::fence::admits_cycle(true, Some(open), Some(c)), open == c);
            assert!(!scsi::fence::admits_cycle(true, None, Some(c)));
            assert!(!scsi::fence::admits_cycle(false, Some(c), Some(c)));
        }
    }
});
