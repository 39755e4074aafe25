//! The result documents: which there are and where they come from, and docs/lab-r0-r1.md,
//! regenerated from the results' JSON: tables, figures and the studies' numbers side by
//! side.

use crate::stats::Spread;
use anyhow::Result;
use serde_json::Value;
use std::fmt::Write;
use std::path::{Component, Path, PathBuf};

/// A generated document, by the scenarios it reports.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Document {
    /// R0, R1 and the RTT sweep (r0.json, r1.json, rtt.json).
    #[value(name = "r0-r1")]
    R0R1,
    R2,
    R3,
    R4,
}

impl Document {
    /// Its name in docs/.
    pub fn file(self) -> &'static str {
        match self {
            Document::R0R1 => "lab-r0-r1.md",
            Document::R2 => "lab-r2.md",
            Document::R3 => "lab-r3.md",
            Document::R4 => "lab-r4.md",
        }
    }

    /// Writes it to `out` from the results under `results`.
    pub fn write(self, results: &Path, out: &Path) -> Result<()> {
        match self {
            Document::R0R1 => write(results, out),
            Document::R2 => crate::r2::write_doc(results, out),
            Document::R3 => crate::r3::write_doc(results, out),
            Document::R4 => crate::r4::write_doc(results, out),
        }
    }
}

/// The committed documents and the results each is drawn from (`rsv-lab doc`).
const COMMITTED: &[(Document, &str, &str)] = &[
    (Document::R0R1, "lab/results", "docs/lab-r0-r1.md"),
    (Document::R0R1, "lab/results/cc", "docs/lab-cc.md"),
    (Document::R2, "lab/results", "docs/lab-r2.md"),
    (Document::R3, "lab/results", "docs/lab-r3.md"),
    (Document::R4, "lab/results", "docs/lab-r4.md"),
    (Document::R4, "lab/results/r4-default", "docs/lab-r4-default.md"),
    (Document::R4, "lab/results/r4-windows", "docs/lab-r4-windows.md"),
];

/// Rewrites every committed document from its results (run from the repository's top).
pub fn write_committed() -> Result<()> {
    if !Path::new("docs").is_dir() || !Path::new("lab/results").is_dir() {
        anyhow::bail!("no docs/ and lab/results/ here: run `rsv-lab doc` from the repository's top");
    }
    for (document, results, out) in COMMITTED {
        document.write(Path::new(results), Path::new(out))?;
        eprintln!("lab: wrote {out} from {results}");
    }
    Ok(())
}

/// `to` as seen from directory `from` (both made absolute first).
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
    let abs = |p: &Path| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| std::env::current_dir().unwrap_or_default().join(p))
    };
    let (f, t) = (abs(from), abs(to));
    let fc: Vec<Component> = f.components().collect();
    let tc: Vec<Component> = t.components().collect();
    let common = fc.iter().zip(&tc).take_while(|(a, b)| a == b).count();
    let mut r = PathBuf::new();
    for _ in common..fc.len() {
        r.push("..");
    }
    for c in &tc[common..] {
        r.push(c);
    }
    r
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Whether any of `rows` is of configuration `name`.
fn names_ran(rows: &[&Value], name: &str) -> bool {
    rows.iter().any(|x| s(&x["config"]) == name)
}

/// How many times Reservoir's rows ran (`--repeat`; 1 for results from before it).
fn repeats(r: &Value) -> u64 {
    r["params"]["repeat"].as_u64().unwrap_or(1).max(1)
}

/// What a repeated run's tables show.
fn repeat_note(doc: &mut String, r: &Value, what: &str) {
    let n = repeats(r);
    if n > 1 {
        let _ = writeln!(
            doc,
            "{what} ran {n} times each, interleaved (every row once, then again): each figure \
             is the median of the {n}, with the range (min–max) in brackets; a repetition that \
             failed is left out and said.\n"
        );
    }
}

/// The median and range of `rows`' Mbit/s (those without an error), `digits` decimals;
/// "error" when every one failed, "—" when there is none.
fn mbit_cell(rows: &[&Value], digits: usize) -> String {
    let ok: Vec<&&Value> = rows.iter().filter(|x| s(&x["error"]).is_empty()).collect();
    let failed = rows.len() - ok.len();
    match Spread::of(ok.iter().map(|x| f(&x["mbit_per_s"]))) {
        Some(sp) => {
            let mark = if ok.iter().any(|x| x["complete"].as_bool() == Some(false)) {
                " †"
            } else {
                ""
            };
            let fails = if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            };
            format!("{}{mark}{fails}", sp.show(digits, ""))
        }
        None if failed > 0 => "error".into(),
        None => "—".into(),
    }
}

fn env_block(doc: &mut String, r: &Value) {
    let e = &r["environment"];
    let _ = writeln!(doc, "Command: `{}`  ", s(&r["command"]));
    let _ = writeln!(
        doc,
        "Measured {} with {} (commit {}), {}, {}, {}; kernel {}; {} CPUs ({}), {} memory, load average at start {}.\n",
        s(&e["date_utc"]),
        s(&e["rsv"]),
        s(&e["git_commit"]),
        s(&e["tgtd"]),
        s(&e["qemu_img"]),
        s(&e["iperf3"]),
        s(&e["kernel"]),
        s(&e["nproc"]),
        s(&e["cpu"]),
        s(&e["memory"]),
        s(&e["load_average"]),
    );
}

fn r0_section(doc: &mut String, r: &Value, link: &Path) {
    let p = &r["params"];
    let losses: Vec<f64> = p["loss_pct"]
        .as_array()
        .map(|a| a.iter().map(f).collect())
        .unwrap_or_default();
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(doc, "## R0 — iSCSI tuning over a lossy long fat pipe\n");
    let _ = writeln!(
        doc,
        "Link: {} at {} RTT, random loss both ways (`rsv-lab wan`). Target in site b, initiator in \
         site a. Each point moves data for {} s (`rsv bench --pattern seq`, sequential 256 KiB or \
         1 MiB commands; those in flight at the end are waited for and counted over the longer \
         time, as a copy of what was issued) or copies an image sized to what the link carried in that time \
         (`qemu-img convert`, at most {} MiB; cut at twice the time, bytes so far counted, marked †). \
         Throughput in Mbit/s of payload.\n",
        s(&p["rate"]),
        s(&p["rtt"]),
        f(&p["seconds"]),
        f(&p["qemu_max_bytes"]) / 1048576.0
    );
    repeat_note(
        doc,
        r,
        "The iSCSI configurations (iperf3, qemu-img and tgt once a point)",
    );
    for dir in ["write", "read"] {
        let sel: Vec<&Value> = rows
            .iter()
            .filter(|x| s(&x["direction"]) == dir || s(&x["direction"]) == "network")
            .collect();
        if !sel.iter().any(|x| s(&x["direction"]) == dir) {
            continue;
        }
        let _ = writeln!(doc, "### Sequential {dir}s (Mbit/s)\n");
        let mut head = String::from("| configuration |");
        let mut line = String::from("|---|");
        for l in &losses {
            let _ = write!(head, " {l} % |");
            line += "---:|";
        }
        let _ = writeln!(doc, "{head}\n{line}");
        let mut names: Vec<&str> = Vec::new();
        for x in &sel {
            if !names.contains(&s(&x["config"])) {
                names.push(s(&x["config"]));
            }
        }
        for name in names {
            let mut l = format!("| {name} |");
            for loss in &losses {
                let cell: Vec<&Value> = sel
                    .iter()
                    .copied()
                    .filter(|x| s(&x["config"]) == name && (f(&x["loss_pct"]) - loss).abs() < 1e-9)
                    .collect();
                let _ = write!(l, " {} |", mbit_cell(&cell, 2));
            }
            let _ = writeln!(doc, "{l}");
        }
        let ratio = |a: &str, b: &str| {
            let mut l = format!("| {a} ÷ {b} |");
            for loss in &losses {
                // The medians.
                let get = |n: &str| {
                    Spread::of(
                        sel.iter()
                            .filter(|x| {
                                s(&x["config"]) == n
                                    && s(&x["direction"]) == dir
                                    && s(&x["error"]).is_empty()
                                    && (f(&x["loss_pct"]) - loss).abs() < 1e-9
                            })
                            .map(|x| f(&x["mbit_per_s"])),
                    )
                    .map(|sp| sp.median)
                };
                match (get(a), get(b)) {
                    (Some(x), Some(y)) if y > 0.0 => {
                        let _ = write!(l, " {:.1}× |", x / y);
                    }
                    _ => l += " — |",
                }
            }
            l
        };
        // Only where the study's "before" ran (not with --reservoir-only or --rows).
        if names_ran(&sel, "R0 before") {
            let _ = writeln!(doc, "{}", ratio("R0 tuned (2b)", "R0 before"));
            let _ = writeln!(doc, "{}", ratio("Reservoir default", "R0 before"));
        }
        let _ = writeln!(
            doc,
            "\n![R0 {dir}s]({})\n",
            link.join(format!("r0-{dir}.png")).display()
        );
    }
    let reservoir: Vec<(String, &Value)> = rows
        .iter()
        .filter(|x| s(&x["config"]).starts_with("Reservoir"))
        .map(|x| {
            (
                format!(
                    "{} {}, {} %",
                    s(&x["config"]),
                    s(&x["direction"]),
                    f(&x["loss_pct"])
                ),
                x,
            )
        })
        .collect();
    link_use_table(doc, &reservoir);
    let _ = writeln!(
        doc,
        "**Study (R0, UNH iSCSI, 100 Mbit/s, 100 ms):** tuning gave a several-fold improvement; the \
         throughput target was met at 0.001 % loss with the BDP tuning (1) and at 0.01 % with the \
         loss tuning (2); at 0.1 % and 1 % even the tuned system fell short. The study gives no \
         absolute Mbit/s in the text we have (`REFERENCES.md`), so its figures are compared by \
         shape: the tuned/before ratio and where each configuration falls off the link rate.\n"
    );
    let _ = writeln!(
        doc,
        "Configurations (both sites' TCP set per namespace with sysctl):\n"
    );
    if let Some(cfgs) = r["configs"].as_array() {
        for c in cfgs {
            let tcp: Vec<String> = c["sysctl"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|kv| {
                            format!(
                                "{}={}",
                                s(&kv[0]).trim_start_matches("net.ipv4."),
                                s(&kv[1])
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let opts: Vec<&str> = c["initiator_opts"]
                .as_array()
                .map(|a| a.iter().map(s).collect())
                .unwrap_or_default();
            let _ =
                writeln!(
                doc,
                "- **{}**: connections {}, queue depth {}, I/O {}; initiator options [{}]; target \
                 `[session]` {{{}}}; TCP {}.",
                s(&c["label"]),
                c["connections"].as_u64().map_or("default".into(), |x| x.to_string()),
                c["queue_depth"].as_u64().map_or("default".into(), |x| x.to_string()),
                s(&c["io_size"]),
                opts.join(", "),
                s(&c["target_session"]).trim().replace('\n', "; "),
                tcp.join(", ")
            );
        }
    }
    let _ = writeln!(
        doc,
        "- Note on Reservoir default: `rsv bench` with no session flags, i.e. auto-tuning: the \
         initiator measures the RTT before login and chooses connections (2 unpaced on this \
         path; with `--rate`, 8 paced to the rate's share), queue depth, bursts and buffers; \
         both ends use BBR on their sockets where the kernel has it, and the target sizes its \
         buffers from each connection's RTT. `rsv tune URL` shows the choices."
    );
    let _ = writeln!(
        doc,
        "- **qemu-img → tgt / → Reservoir**: `qemu-img convert -p -n -O raw` (libiscsi, its \
         defaults) into tgt's LUN 1 / Reservoir's default target; Linux default TCP with CUBIC.\n\
         - **iperf3 CUBIC / BBR**: one stream, `iperf3 -C cubic|bbr -t {}`, the network's own \
         ceiling at each point.\n",
        f(&p["seconds"])
    );
    env_block(doc, r);
}

fn r1_section(doc: &mut String, r: &Value, link: &Path) {
    let p = &r["params"];
    let _ = writeln!(doc, "## R1 — four image backups into one bottleneck\n");
    let _ = writeln!(
        doc,
        "Four senders (`--hosts-a 4`, unlimited virtual links into the emulator: the fast side) \
         each back up a {} MiB image with `rsv cp` to its own LUN of one `rsv target` behind a {} \
         bottleneck, RTT {}, drop-tail queue {} (shallow). Link use = goodput ÷ bottleneck; wire \
         use counts every byte that left the bottleneck (headers, retransmissions).\n",
        f(&p["image_bytes"]) / 1048576.0,
        s(&p["rate"]),
        s(&p["rtt"]),
        s(&p["queue"])
    );
    // The note on repetitions comes before the table: a line inside it would end it.
    repeat_note(
        doc,
        r,
        "The modes; per stream and queue drops are those of the median repetition (by link use)",
    );
    let _ = writeln!(
        doc,
        "| run | per stream (MB/s) | total (MB/s) | link use | wire use | Jain | queue drops |\n\
         |---|---|---:|---:|---:|---:|---:|"
    );
    let modes = r["modes"].as_array().cloned().unwrap_or_default();
    // One line a mode: its median repetition, with the spreads over all of them.
    let mut keys: Vec<&str> = Vec::new();
    for m in &modes {
        if !keys.contains(&s(&m["key"])) {
            keys.push(s(&m["key"]));
        }
    }
    for key in keys {
        let runs: Vec<&Value> = modes.iter().filter(|m| s(&m["key"]) == key).collect();
        let mut by_use = runs.clone();
        by_use.sort_by(|a, b| f(&a["link_use_pct"]).total_cmp(&f(&b["link_use_pct"])));
        let m = by_use[(by_use.len() - 1) / 2];
        let spread = |k: &str, digits: usize, unit: &str| {
            Spread::of(runs.iter().map(|x| f(&x[k])))
                .map_or("—".into(), |sp| sp.show(digits, unit))
        };
        let streams: Vec<String> = m["streams"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        if s(&x["error"]).is_empty() {
                            format!("{:.1}", f(&x["mb_per_s"]))
                        } else {
                            "error".into()
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            doc,
            "| {} ({}) | {} | {} | {} | {} | {} | {} |",
            s(&m["label"]),
            s(&m["tool"]),
            streams.join(" / "),
            spread("total_mb_per_s", 1, ""),
            spread("link_use_pct", 1, " %"),
            spread("wire_use_pct", 1, " %"),
            spread("jain", 3, ""),
            m["queue_drops"].as_u64().unwrap_or(0)
        );
    }
    let _ = writeln!(
        doc,
        "| **study pattern 1**: 10 GbE virtio senders into 1 GbE | ~5.3 each | 21.2 | 21.2 % | | | |\n\
         | **study pattern 2**: senders limited to 1 G (e1000) | 16.6–26.6 | 95.7 | 95.7 % | | | |\n"
    );
    let _ = writeln!(
        doc,
        "On this kernel the study's collapse does not appear, and this scenario does not tell \
         the modes apart as the study's patterns did: four unpaced CUBIC flows fill the \
         bottleneck too. Checked by hand (2026-11-22, kernel 6.18, iperf3 CUBIC ×4, 10 s, \
         this link): 240 Mbit/s of 250 with today's stack and 239 with RACK and tail loss \
         probes off (`tcp_recovery=0`, `tcp_early_retrans=0`); with the queue cut to 16 KiB \
         and SACK and timestamps off as well, 152 Mbit/s (61 %), against 195 (78 %) with \
         today's stack. The study's 21 % came from its senders and stack (virtio guests at \
         10 GbE into a 1 GbE port, a kernel of that time); the emulator's unlimited fast side \
         with today's TCP does not recreate it. What this scenario does show is that \
         Reservoir's default, set by no one, keeps the link full and the four backups even.\n"
    );
    r1_link_table(doc, &modes);
    let _ = writeln!(doc, "![R1]({})\n", link.join("r1.png").display());
    env_block(doc, r);
}

/// Where R1's bottleneck time went in each mode that watched it: medians over the
/// repetitions.
fn r1_link_table(doc: &mut String, modes: &[Value]) {
    let mut keys: Vec<&str> = Vec::new();
    for m in modes.iter().filter(|m| m["link"].is_object()) {
        if !keys.contains(&s(&m["key"])) {
            keys.push(s(&m["key"]));
        }
    }
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(
        doc,
        "Where the bottleneck's time went (the backups' wall time, from starting the four \
         `rsv cp` to the last one's end; the bottleneck's byte counters read every 0.2 s; \
         medians of the repetitions). *Busy* counts every byte that left the bottleneck; \
         *full* is the first 0.2 s at 90 % of the rate or more; the seconds lost are link \
         time at the full rate that went unused, counted from the bytes over each phase: \
         before that point (the processes' start, login, the first round trips), after it \
         until the first backup ended, and after that (the others finishing).\n"
    );
    let _ = writeln!(
        doc,
        "| run | wall | link busy | full after | lost starting | lost later | lost after the \
         first ended |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    for key in keys {
        let runs: Vec<&Value> = modes
            .iter()
            .filter(|m| s(&m["key"]) == key && m["link"].is_object())
            .collect();
        let med = |g: &dyn Fn(&Value) -> f64| {
            Spread::of(runs.iter().map(|x| g(x))).map_or(0.0, |sp| sp.median)
        };
        let _ = writeln!(
            doc,
            "| {} | {:.1} s | {:.1} % | {:.1} s | {:.2} s | {:.2} s | {:.2} s |",
            s(&runs[0]["label"]),
            med(&|x| f(&x["wall_seconds"])),
            med(&|x| f(&x["link"]["busy_pct"])),
            med(&|x| f(&x["link"]["start_s"])),
            med(&|x| f(&x["link"]["lost_start_s"])),
            med(&|x| f(&x["link"]["lost_later_s"])),
            med(&|x| f(&x["link"]["lost_end_s"])),
        );
    }
    let _ = writeln!(doc);
}

fn rtt_section(doc: &mut String, r: &Value) {
    let p = &r["params"];
    let points = r["points"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        doc,
        "## RTT sweep — one link, round trips from LAN to far\n"
    );
    let _ = writeln!(
        doc,
        "Link: {} (`rsv-lab wan`), no loss, the queue one BDP at each RTT. Each figure moves data \
         for {} s: iperf3 BBR (one stream) as the network's ceiling, and `rsv bench --pattern \
         seq` with Reservoir's defaults writing and reading 1 MiB commands: share of the link \
         in payload, over the whole run (start-up included, and the commands in flight at its \
         end waited for). Issue 21's goal is 92 % at every point.\n",
        s(&p["rate"]),
        f(&p["seconds"]),
    );
    repeat_note(doc, r, "Reservoir's rows (iperf3 once a point)");
    let _ = writeln!(
        doc,
        "| RTT (ms) | run | write | read |\n|---:|---|---:|---:|"
    );
    let mut rtts: Vec<u64> = points.iter().filter_map(|x| x["rtt_ms"].as_u64()).collect();
    rtts.dedup();
    for rtt in rtts {
        let at: Vec<&Value> = points
            .iter()
            .filter(|x| x["rtt_ms"].as_u64() == Some(rtt))
            .collect();
        let mut configs: Vec<&str> = Vec::new();
        for x in &at {
            if !configs.contains(&s(&x["row"]["config"])) {
                configs.push(s(&x["row"]["config"]));
            }
        }
        for config in configs {
            // Share of the link: median and range over the repetitions.
            let cell = |dir: &str| {
                let runs: Vec<&&Value> = at
                    .iter()
                    .filter(|x| {
                        s(&x["row"]["config"]) == config && s(&x["row"]["direction"]) == dir
                    })
                    .collect();
                let ok: Vec<&&&Value> = runs
                    .iter()
                    .filter(|x| s(&x["row"]["error"]).is_empty())
                    .collect();
                match Spread::of(ok.iter().map(|x| f(&x["link_pct"]))) {
                    Some(sp) if ok.len() < runs.len() => {
                        format!("{}, {} failed", sp.show(1, " %"), runs.len() - ok.len())
                    }
                    Some(sp) => sp.show(1, " %"),
                    None => match runs.first() {
                        Some(x) => format!("failed: {}", s(&x["row"]["error"])),
                        None => "—".into(),
                    },
                }
            };
            if at
                .iter()
                .any(|x| s(&x["row"]["config"]) == config && s(&x["row"]["direction"]) == "network")
            {
                let _ = writeln!(
                    doc,
                    "| {rtt} | {config} (the network) | {} | |",
                    cell("network")
                );
            } else {
                let _ = writeln!(
                    doc,
                    "| {rtt} | {config} | {} | {} |",
                    cell("write"),
                    cell("read")
                );
            }
        }
    }
    let _ = writeln!(doc);
    let reservoir: Vec<(String, &Value)> = points
        .iter()
        .filter(|x| s(&x["row"]["direction"]) != "network")
        .map(|x| {
            (
                format!(
                    "{} ms {} {}",
                    f(&x["rtt_ms"]),
                    s(&x["row"]["config"]),
                    s(&x["row"]["direction"])
                ),
                &x["row"],
            )
        })
        .collect();
    link_use_table(doc, &reservoir);
    env_block(doc, r);
}

/// Where the link's time went in each labelled `rsv bench` row that has the bottleneck's
/// counters: how busy it was, and the time lost before it first ran full and after.
/// Rows with the same label are repetitions: one line gives their medians, with the range
/// of the payload rate and of the time to full.
fn link_use_table(doc: &mut String, rows: &[(String, &Value)]) {
    let rows: Vec<&(String, &Value)> = rows
        .iter()
        .filter(|(_, x)| x["link"].is_object() && s(&x["error"]).is_empty())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        doc,
        "Where the link's time went (Reservoir's runs; the bottleneck's byte counters read every \
         0.2 s over the measured time). *Busy* counts every byte that left the bottleneck, \
         headers included, so payload is at most about 96.5 % of it (less is bytes sent \
         twice); *full* is the first \
         0.2 s at 90 % of the rate or more; the seconds lost are link time at the full rate \
         that went unused, counted from the bytes over each phase: before that point \
         (start-up), after it until the issuing stopped (probing, recovery, stalls), and \
         while the commands then in flight finished (the end).\n"
    );
    let _ = writeln!(
        doc,
        "| run | payload Mbit/s | link busy | payload ÷ wire | full after | lost starting | \
         lost later | lost at the end |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut labels: Vec<&str> = Vec::new();
    for (label, _) in &rows {
        if !labels.contains(&label.as_str()) {
            labels.push(label);
        }
    }
    let mut old_count = false;
    for label in labels {
        let runs: Vec<&Value> = rows
            .iter()
            .filter(|(l, _)| l == label)
            .map(|(_, x)| *x)
            .collect();
        let med = |g: &dyn Fn(&Value) -> f64| {
            Spread::of(runs.iter().map(|x| g(x))).unwrap_or(Spread {
                n: 0,
                median: 0.0,
                min: 0.0,
                max: 0.0,
            })
        };
        let payload = med(&|x| f(&x["mbit_per_s"]));
        let busy = med(&|x| f(&x["link"]["busy_pct"]));
        let share = med(&|x| f(&x["bytes"]) / f(&x["link"]["wire_bytes"]).max(1.0) * 100.0);
        let full = med(&|x| f(&x["link"]["start_s"]));
        // Results from before the seconds lost were counted from each phase's bytes (no
        // `lost_end_s`) summed the shortfalls of single intervals, which overstated them:
        // not shown.
        let counted = runs.iter().all(|x| x["link"]["lost_end_s"].is_number());
        let mut secs = |key: &str| {
            if counted {
                format!("{:.2} s", med(&|x| f(&x["link"][key])).median)
            } else {
                old_count = true;
                "—".to_owned()
            }
        };
        let lost = [
            secs("lost_start_s"),
            secs("lost_later_s"),
            secs("lost_end_s"),
        ];
        let _ = writeln!(
            doc,
            "| {label} | {} | {:.1} % | {:.1} % | {} | {} | {} | {} |",
            payload.show(2, ""),
            busy.median,
            share.median,
            full.show(1, " s"),
            lost[0],
            lost[1],
            lost[2],
        );
    }
    if old_count {
        let _ = writeln!(
            doc,
            "\n— : measured before the seconds lost were counted from each phase's bytes; \
             the earlier count added up the shortfalls of single 0.2-s intervals, which a \
             reading timed late made up on a busy link, and is not shown."
        );
    }
    let _ = writeln!(doc);
}

pub fn write(results: &Path, out: &Path) -> Result<()> {
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let link = relative(dir, results);
    // The results' directory as the repository names it (lab/results for the committed
    // document).
    let shown = std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            std::fs::canonicalize(results)
                .ok()?
                .strip_prefix(cwd)
                .ok()
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| results.to_path_buf());
    let mut doc = format!(
        "# Lab: R0 and R1 reproduced, and an RTT sweep\n\n\
         Generated by `rsv-lab` (lab/) from the results under \
         `{}/` — do not edit by hand; rerun `rsv-lab run all` (or `rsv-lab doc` to \
         redraw from the JSON). The studies are summarised in `shared/REFERENCES.md`. Every \
         number below comes from one run in which Reservoir and its peers crossed the same \
         emulated link.\n\n",
        shown.display()
    );
    let mut any = false;
    if let Ok(r) = crate::r0::load(results) {
        r0_section(&mut doc, &r, &link);
        any = true;
    }
    if let Ok(r) = crate::r1::load(results) {
        r1_section(&mut doc, &r, &link);
        any = true;
    }
    if let Ok(r) = crate::rtt::load(results) {
        rtt_section(&mut doc, &r);
        any = true;
    }
    if !any {
        anyhow::bail!(
            "no r0.json, r1.json or rtt.json under {}",
            results.display()
        );
    }
    std::fs::write(out, doc)?;
    Ok(())
}
