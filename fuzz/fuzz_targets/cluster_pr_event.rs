//! A reservation change's event as another gateway of the group publishes it through the
//! cluster (`scsi::decode_notices`: unit attentions by initiator port, and PREEMPT AND
//! ABORT's ports whose tasks are to be aborted). Never panics; only the unit attentions
//! reservations raise come through; what decodes encodes and decodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use scsi::sense;

fuzz_target!(|data: &[u8]| {
    let event = scsi::decode_notices(data);
    for (port, s) in &event.notices {
        assert!(!port.is_empty() && !port.contains(char::is_whitespace));
        assert!([
            sense::RESERVATIONS_PREEMPTED,
            sense::RESERVATIONS_RELEASED,
            sense::REGISTRATIONS_PREEMPTED,
        ]
        .contains(s));
    }
    for port in &event.abort {
        assert!(!port.is_empty() && !port.contains(char::is_whitespace));
    }
    assert_eq!(scsi::decode_notices(&scsi::encode_notices(&event)), event);
});
