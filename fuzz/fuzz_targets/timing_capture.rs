//! `rsv-lab timing`'s reading of a capture, from anyone: the bytes of a pcap or pcapng file
//! through `timing::pcap::frames`, each frame to its TCP segment (`timing::packet`), and
//! the whole analysis (connections, bursts, ACKs, iSCSI PDUs reassembled from the streams
//! and the commands' latencies) into the JSON report `--json` prints. Property: no panic,
//! whatever the file holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use timing::analysis::{analyse, BurstRule, Options};
use timing::pcap::frames;

fuzz_target!(|data: &[u8]| {
    let Ok(frames) = frames(data) else {
        return;
    };
    for f in &frames {
        let _ = timing::packet::tcp(f.linktype, f.data);
    }
    let mut opts = Options::default();
    let report = analyse(&frames, &opts, true);
    let _ = serde_json::to_vec(&report);
    // The rate-derived burst rule and a port filter take other paths.
    opts.burst = BurstRule::Link {
        rate_bps: 1_000_000,
    };
    opts.port = Some(3260);
    let _ = analyse(&frames, &opts, false);
});
