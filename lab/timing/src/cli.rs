//! `rsv-lab timing CAPTURE`: the summary, `--json`, `--plot`.

use anyhow::{bail, Result};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::analysis::{BurstRule, Connection, Direction, Dist, Options, Report};

#[derive(Args, Debug)]
#[command(
    about = "Packet timing of a capture (pcap/pcapng): bursts, gaps, ACKs, iSCSI PDUs and command latency (R3's analysis)",
    after_help = "Capture with e.g. `tcpdump -i any -w cap.pcap tcp port 3260` (next to the sender to see its \
departures; `-s 0` keeps whole packets so that iSCSI PDUs can be decoded).\n\n\
A burst is a run of data packets each within the burst gap of the one before: --link-rate R makes the \
gap 1.5 × the packet's serialization time at R (back to back on that link); else --burst-gap \
(default 100us). Pure ACKs neither count nor break a burst.\n\n\
Command latency (iSCSI in clear text): total = command → its status; target time = (command → first \
answer) − the round trip capture→target→capture (smallest seen, ACKs and handshake); network time = \
total − target time."
)]
pub struct TimingArgs {
    /// The capture file (pcap or pcapng).
    pub capture: PathBuf,
    /// Only connections with this TCP port on one side (that side is the server).
    #[arg(long)]
    pub port: Option<u16>,
    /// Packets within this gap of the one before are one burst (e.g. 100us, 1ms).
    #[arg(long, value_parser = parse_gap, conflicts_with = "link_rate")]
    pub burst_gap: Option<u64>,
    /// The link's rate (e.g. 1gbit): the burst gap is 1.5 × a packet's serialization time.
    #[arg(long, value_parser = parse_link_rate)]
    pub link_rate: Option<u64>,
    /// Print JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// With --json: every data packet, ACK and burst size too.
    #[arg(long)]
    pub packets: bool,
    /// Draw the timeline of each connection shown (its busier direction) to this PNG.
    #[arg(long, value_name = "PNG")]
    pub plot: Option<PathBuf>,
    /// The plot's window: from this many milliseconds after the capture's start...
    #[arg(long, value_name = "MS")]
    pub from: Option<f64>,
    /// ...for this many milliseconds (default: all of it).
    #[arg(long, value_name = "MS")]
    pub span: Option<f64>,
    /// How many PDUs of each connection the summary lists (all are in --json).
    #[arg(long, default_value_t = 12)]
    pub pdus: usize,
    /// Do not decode iSCSI.
    #[arg(long)]
    pub no_iscsi: bool,
}

fn parse_gap(s: &str) -> Result<u64, String> {
    units::parse_duration(s)
        .map(|d| d.as_nanos() as u64)
        .map_err(|e| e.to_string())
}

fn parse_link_rate(s: &str) -> Result<u64, String> {
    match units::parse_rate(s) {
        Ok(r) if r.bits_per_sec() > 0 => Ok(r.bits_per_sec()),
        Ok(_) => Err("the link rate must be above 0".into()),
        Err(e) => Err(e.to_string()),
    }
}

impl TimingArgs {
    pub fn options(&self) -> Options {
        Options {
            port: self.port,
            burst: match (self.link_rate, self.burst_gap) {
                (Some(r), _) => BurstRule::Link { rate_bps: r },
                (None, Some(ns)) => BurstRule::Gap { ns },
                (None, None) => BurstRule::Gap {
                    ns: BurstRule::DEFAULT_GAP_NS,
                },
            },
            no_iscsi: self.no_iscsi,
        }
    }
}

pub fn run(args: TimingArgs) -> Result<()> {
    let keep = args.packets || args.plot.is_some();
    let report = crate::analyse_file(&args.capture, &args.options(), keep)?;
    if let Some(png) = &args.plot {
        let panels: Vec<_> = report
            .connections
            .iter()
            .filter(|c| c.to_client.data_packets + c.to_server.data_packets > 0)
            .map(|c| crate::plot::Panel {
                title: format!("{} ↔ {}", c.client, c.server),
                conn: c,
            })
            .take(4)
            .collect();
        if panels.is_empty() {
            bail!(
                "{}: no TCP connection with data to draw",
                args.capture.display()
            );
        }
        crate::plot::timeline(png, &panels, args.from, args.span)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", summary(&report, args.pdus));
    }
    Ok(())
}

fn dist(d: &Dist, unit: &str, prec: usize) -> String {
    if d.count == 0 {
        return "–".into();
    }
    format!(
        "median {:.p$}{unit}, p90 {:.p$}{unit}, max {:.p$}{unit}",
        d.median,
        d.p90,
        d.max,
        p = prec
    )
}

fn direction(s: &mut String, name: &str, d: &Direction) {
    let _ = writeln!(
        s,
        "  {name}: {} packets, {} with data, {} payload bytes, {} retransmitted{}{}",
        d.packets,
        d.data_packets,
        d.payload_bytes,
        d.retransmits,
        d.mss.map_or(String::new(), |m| format!(", MSS {m}")),
        if d.mbit_per_s > 0.0 {
            format!(", {:.1} Mbit/s over its span", d.mbit_per_s)
        } else {
            String::new()
        }
    );
    if d.data_packets > 0 {
        let b = &d.bursts;
        let _ = writeln!(
            s,
            "    bursts: {}; size in segments {}; in packets {}; bytes {}",
            b.count,
            dist(&b.segments, "", 0),
            dist(&b.packets, "", 0),
            dist(&b.bytes, "", 0)
        );
        let _ = writeln!(
            s,
            "    gaps between bursts: {}; {:.1} % of the bytes went in bursts of one packet",
            dist(&b.gaps_us, " µs", 1),
            b.single_packet_pct
        );
    }
}

fn connection(s: &mut String, c: &Connection, pdus: usize) {
    let ms = |x: Option<f64>| x.map_or("?".to_owned(), |v| format!("{v:.3} ms"));
    let _ = writeln!(
        s,
        "{} → {}: from {:.3} s for {:.3} s; round trip to server {}, to client {}",
        c.client,
        c.server,
        c.start_s,
        c.duration_s,
        ms(c.rtt_to_server_ms),
        ms(c.rtt_to_client_ms)
    );
    direction(s, "client → server", &c.to_server);
    direction(s, "server → client", &c.to_client);
    if let Some(i) = &c.iscsi {
        let _ = writeln!(
            s,
            "  iSCSI: {} PDUs, {} SCSI commands, digests header {} data {}{}",
            i.pdus.len(),
            i.commands.len(),
            i.header_digest,
            i.data_digest,
            if i.decode_errors > 0 {
                format!(", {} malformed PDUs", i.decode_errors)
            } else {
                String::new()
            }
        );
        for st in &i.stopped {
            let _ = writeln!(s, "    decoding stopped, {st}");
        }
        for h in &i.holes {
            let _ = writeln!(s, "    {h}");
        }
        for p in i.pdus.iter().take(pdus) {
            let _ = writeln!(
                s,
                "    {:>10.6} s {} {:<16} ITT 0x{:08x}{} len {}{}",
                p.t_ns as f64 / 1e9,
                p.dir,
                p.name,
                p.itt,
                p.buffer_offset
                    .map_or(String::new(), |o| format!(" offset {o}")),
                p.data_len,
                p.r2t_len
                    .map_or(String::new(), |l| format!(" (R2T for {l})"))
            );
        }
        if i.pdus.len() > pdus {
            let _ = writeln!(s, "    ... {} more (--json lists all)", i.pdus.len() - pdus);
        }
        if i.total_ms.count > 0 {
            let _ = writeln!(
                s,
                "    command latency: total {}",
                dist(&i.total_ms, " ms", 3)
            );
            let _ = writeln!(s, "      target time {}", dist(&i.target_ms, " ms", 3));
            let _ = writeln!(s, "      network time {}", dist(&i.network_ms, " ms", 3));
        }
    }
}

/// The human summary.
pub fn summary(r: &Report, pdus: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} frames, {} TCP packets, {} connections; bursts: {}",
        r.frames,
        r.tcp_packets,
        r.connections.len(),
        r.burst_rule
    );
    for c in &r.connections {
        connection(&mut s, c, pdus);
    }
    s
}
