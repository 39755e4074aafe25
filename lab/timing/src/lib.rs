//! `rsv-lab timing`: R3's packet-timing analysis for everyone. A capture (pcap or pcapng, from
//! tcpdump, dumpcap or tshark) is read ([`pcap`], sans-IO), each frame decoded to its TCP
//! segment ([`packet`]), and every TCP connection analysed ([`analysis`], sans-IO): packet
//! departures and ACKs over time, bursts and the gaps between them, and for iSCSI in clear
//! text the PDUs reassembled from the stream with Reservoir's own codec and each command's
//! latency split into target and network time. [`cli`] prints it (`--json` for machines)
//! and [`plot`] draws the timeline.

pub mod analysis;
pub mod cli;
pub mod packet;
pub mod pcap;
pub mod plot;

pub use analysis::{analyse, BurstRule, Options, Report};

/// Reads and analyses a capture file (the I/O edge for other crates, e.g. the lab).
pub fn analyse_file(
    path: &std::path::Path,
    opts: &Options,
    keep_packets: bool,
) -> anyhow::Result<Report> {
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let frames = pcap::frames(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(analyse(&frames, opts, keep_packets))
}
