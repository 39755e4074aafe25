//! `rsv target --metrics` against the real consumers of the exposition: `promtool check
//! metrics` lints what a target that served reads, writes, a CHECK CONDITION and a
//! refused login exposes, and Debian's Prometheus server, scraping every second while
//! `rsv bench` runs, computes a byte rate that agrees with the bench's own; each
//! connection's series last as long as its session.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::exposition::{promtool_check, sum};
use testkit::ready::RsvIsns;
use testkit::{have, rsv, run, run_ok, Target};

const IQN: &str = "iqn.2026-11.org.reservoir:metrics";

fn config() -> String {
    format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\n[[target]]\niqn = \"{IQN}\"\n\
         [[target.lun]]\nid = 0\nstore = \"ram:?size=256MiB\"\n"
    )
}

/// `rsv ARGS`, as the tests run the initiator: without the path cache.
fn rsv_cmd(args: &[&str]) -> std::process::Output {
    Command::new(rsv())
        .args(args)
        .env("RSV_PATH_CACHE", "off")
        .output()
        .expect("running rsv")
}

fn bench(url: &str, rw: &str, block_size: &str, seconds: &str) -> serde_json::Value {
    let out = rsv_cmd(&[
        "bench",
        url,
        "--rw",
        rw,
        "--block-size",
        block_size,
        "--duration",
        seconds,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "rsv bench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("rsv bench --json")
}

/// `rsv bench` reading `url` in 64 KiB reads for `seconds`, in the background: sessions
/// held while a test looks at their series.
fn reading(url: &str, seconds: &str) -> Child {
    Command::new(rsv())
        .args([
            "bench",
            url,
            "--rw",
            "read",
            "--block-size",
            "64k",
            "--duration",
            seconds,
        ])
        .env("RSV_PATH_CACHE", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("rsv bench")
}

#[test]
fn promtool_accepts_the_exposition_of_a_busy_target() {
    if !have("promtool") || !have("curl") {
        return;
    }
    let t = Target::start(Some(&config()));
    let url = t.url(0);
    bench(&url, "write", "64k", "1");
    bench(&url, "read", "64k", "1");
    // A login to a target that is not there: refused, not found.
    let wrong = format!("iscsi://{}/iqn.2026-11.org.reservoir:nothing/0", t.portal);
    assert!(!rsv_cmd(&["inq", &wrong]).status.success());

    let metrics = format!("http://{}/metrics", t.metrics.as_ref().expect("metrics"));
    let text = run_ok("curl", &["-sf", &metrics]);
    let lun = format!("target=\"{IQN}\",lun=\"0\"");
    assert!(sum(&text, &["rsv_target_lun_bytes_total{", &lun, "op=\"read\""]) > 0.0);
    assert!(
        sum(
            &text,
            &["rsv_target_lun_bytes_total{", &lun, "op=\"write\""]
        ) > 0.0
    );
    // Each session's first command meets its power-on UNIT ATTENTION.
    assert!(sum(&text, &["rsv_target_lun_check_conditions_total{", &lun]) > 0.0);
    assert_eq!(
        sum(
            &text,
            &["rsv_target_logins_refused_total{reason=\"not_found\"}"]
        ),
        1.0,
        "{text}"
    );

    promtool_check(&text);
}

/// Each logged-in connection has series of its own while its session lasts: an info
/// series naming the initiator, the portal, TLS, ERL and digests, its bytes, and the path
/// from TCP_INFO; they go when the session logs out.
#[test]
fn a_sessions_connections_have_series_until_it_logs_out() {
    if !have("promtool") || !have("curl") {
        return;
    }
    let t = Target::start(Some(&config()));
    let metrics = format!("http://{}/metrics", t.metrics.as_ref().expect("metrics"));
    let url = format!("{}?connections=2", t.url(0));
    let mut held = reading(&url, "6");
    let info = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("rsv_target_connection_info{"))
            .map(str::to_owned)
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = run_ok("curl", &["-sf", &metrics]);
        if info(&text).len() == 2 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let lines = info(&text);
    assert_eq!(
        lines.len(),
        2,
        "two connections, one info series each:\n{text}"
    );
    for l in &lines {
        for label in [
            format!("target=\"{IQN}\""),
            "initiator=\"iqn.".to_owned(),
            format!("portal=\"{}\"", t.portal),
            "tls=\"no\"".to_owned(),
            "header_digest=\"none\"".to_owned(),
        ] {
            assert!(l.contains(&label), "{label} missing from {l}");
        }
    }
    assert!(
        sum(&text, &["rsv_target_connection_srtt_seconds{"]) > 0.0,
        "{text}"
    );
    assert!(
        sum(&text, &["rsv_target_connection_cwnd_segments{"]) > 0.0,
        "{text}"
    );
    assert!(
        sum(&text, &["rsv_target_connection_sent_bytes_total{"]) > 0.0,
        "{text}"
    );
    promtool_check(&text);

    assert!(held.wait().unwrap().success());
    let text = run_ok("curl", &["-sf", &metrics]);
    assert!(
        info(&text).is_empty(),
        "series outlived the session:\n{text}"
    );
    assert_eq!(sum(&text, &["rsv_target_connection_srtt_seconds{"]), 0.0);
}

/// A Prometheus server in a directory of its own, killed when dropped.
struct Prometheus {
    child: Child,
    api: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scraping `target` (ADDR:PORT) every second, as job `rsv`.
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: rsv\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // A free port from the kernel; Prometheus binds it a moment later.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let api = format!("http://127.0.0.1:{port}");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("db").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("prometheus.log")).unwrap(),
            ))
            .spawn()
            .expect("starting prometheus");
        let mut p = Prometheus {
            child,
            api,
            _dir: dir,
        };
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = run("curl", &["-sf", &format!("{}/-/ready", p.api)]);
            if ready.status.success() {
                return p;
            }
            if let Some(st) = p.child.try_wait().unwrap() {
                panic!("prometheus exited with {st}:\n{}", p.log());
            }
            assert!(Instant::now() < end, "prometheus not ready:\n{}", p.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query's one series at `time` (Unix seconds): its `value` (an instant
    /// vector) or `values` (a range vector) as JSON.
    fn query(&self, promql: &str, time: f64) -> serde_json::Value {
        let out = run_ok(
            "curl",
            &[
                "-sf",
                &format!("{}/api/v1/query", self.api),
                "--data-urlencode",
                &format!("query={promql}"),
                "--data-urlencode",
                &format!("time={time:.3}"),
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let result = &v["data"]["result"];
        assert_eq!(
            result.as_array().map(Vec::len),
            Some(1),
            "{promql} at {time}: {out}\n{}",
            self.log()
        );
        result[0].clone()
    }

    /// The value of an instant query's one series at `time`.
    fn value(&self, promql: &str, time: f64) -> f64 {
        let v = &self.query(promql, time)["value"][1];
        v.as_str().unwrap().parse().unwrap()
    }
}

/// The bench's bytes (MB) completed by `t` seconds into its run, from its per-second
/// figures, linear within a second.
fn bench_mb_by(per_second: &[f64], t: f64) -> f64 {
    let whole = (t.floor() as usize).min(per_second.len());
    let done: f64 = per_second[..whole].iter().sum();
    done + per_second.get(whole).map_or(0.0, |mb| mb * (t - t.floor()))
}

#[test]
fn prometheus_rate_agrees_with_the_bench() {
    if !have("prometheus") || !have("curl") {
        return;
    }
    let t = Target::start(Some(&config()));
    let prometheus = Prometheus::start(t.metrics.as_ref().expect("metrics"));
    let report = bench(&t.url(0), "read", "1M", "20");
    let started = report["started_unix_s"].as_f64().unwrap();
    let per_second: Vec<f64> = report["per_second_mb"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(per_second.len() >= 20, "{report}");
    // The ten seconds to 15 s into the run: past the start, before the end.
    let at = started + 15.0;
    // The scrapes after `at` are in by now (every second).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(prometheus.value("up{job=\"rsv\"}", at), 1.0);
    // One LUN: one series.
    let metric = "rsv_target_lun_bytes_total{op=\"read\"}";
    let prom_mb_s = prometheus.value(&format!("rate({metric}[10s])"), at) / 1e6;
    // rate() is the increase between the window's first and last samples, over their
    // span: the bench's figure is taken over that same span.
    let samples = prometheus.query(&format!("{metric}[10s]"), at)["values"].clone();
    let times: Vec<f64> = samples
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[0].as_f64().unwrap() - started)
        .collect();
    let (first, last) = (times[0], times[times.len() - 1]);
    assert!(times.len() >= 8, "{samples}");
    let bench_mb_s =
        (bench_mb_by(&per_second, last) - bench_mb_by(&per_second, first)) / (last - first);
    let whole_run = report["MB_per_s"].as_f64().unwrap();
    eprintln!(
        "PromQL rate over {first:.2}..{last:.2} s: {prom_mb_s:.1} MB/s; rsv bench over the \
         same span: {bench_mb_s:.1} MB/s (whole run {whole_run:.1} MB/s)"
    );
    let ratio = prom_mb_s / bench_mb_s;
    assert!(
        (0.95..=1.05).contains(&ratio),
        "PromQL {prom_mb_s:.1} MB/s against the bench's {bench_mb_s:.1} MB/s: {ratio:.3}"
    );
}

/// `rsv isns --metrics`: a target's registration and an initiator's query show as
/// requests by function, the target as a registered node; promtool accepts it.
#[test]
fn isns_counts_registrations_and_queries() {
    if !have("promtool") || !have("curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let isns = RsvIsns::start(&[], &dir.path().join("isns.log"));
    let (server, metrics) = (&isns.addr, &isns.metrics);
    let scrape = || run_ok("curl", &["-sf", &format!("http://{metrics}/metrics")]);
    let before = scrape();
    assert_eq!(sum(&before, &["rsv_isns_nodes"]), 0.0, "{before}");

    let _t = Target::start(Some(&format!(
        "{}[isns]\nserver = \"{server}\"\n",
        config()
    )));
    let registered = "rsv_isns_requests_total{function=\"dev_attr_reg\",result=\"success\"}";
    let end = Instant::now() + Duration::from_secs(20);
    while sum(&scrape(), &[registered]) < 1.0 {
        assert!(
            Instant::now() < end,
            "no registration in 20 s:\n{}",
            scrape()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let listed = rsv_cmd(&["ls", &format!("isns://{server}/")]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(IQN),
        "rsv ls isns://: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let text = scrape();
    assert!(sum(&text, &["rsv_isns_nodes"]) >= 1.0, "{text}");
    assert!(
        sum(
            &text,
            &["rsv_isns_requests_total{function=\"dev_attr_qry\",result=\"success\"}"]
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(sum(&text, &["rsv_isns_auth_refused_total"]), 0.0);
    promtool_check(&text);
}

/// `[metrics] max_series` bounds the LUN series: with room for one LUN's series and three
/// LUNs configured, every scrape carries one LUN's series and none of the others', and
/// the log says so once, however many scrapes meet the cap.
#[test]
fn the_series_cap_leaves_luns_out_and_logs_it_once() {
    if !have("promtool") || !have("curl") {
        return;
    }
    // A LUN carries about a hundred series: 150 holds one LUN's, not two.
    let mut config = format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\nmax_series = 150\n[[target]]\niqn = \"{IQN}\"\n"
    );
    for lun in 0..3 {
        config += &format!("[[target.lun]]\nid = {lun}\nstore = \"ram:?size=8MiB\"\n");
    }
    let t = Target::start(Some(&config));
    // Commands on every LUN, so that each would have series of its own.
    for lun in 0..3 {
        assert!(rsv_cmd(&["inq", &t.url(lun)]).status.success());
    }
    let metrics = format!("http://{}/metrics", t.metrics.as_ref().expect("metrics"));
    let cap_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("pass the cap of 150 series"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for _ in 0..3 {
        let text = run_ok("curl", &["-sf", &metrics]);
        let luns: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("rsv_target_lun_commands_total{"))
            .filter_map(|l| l.split("lun=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(luns.len(), 1, "one LUN's series under the cap:\n{text}");
        let in_flight = text
            .lines()
            .filter(|l| l.starts_with("rsv_target_lun_commands_in_flight{"))
            .count();
        assert_eq!(in_flight, 1, "{text}");
        promtool_check(&text);
    }
    let log = t.log();
    let lines = cap_lines(&log);
    assert_eq!(lines.len(), 1, "one line about the cap:\n{log}");
    assert!(
        lines[0].contains("3 LUNs") && lines[0].contains("the first 1 LUNs"),
        "{}",
        lines[0]
    );
}

/// The pid of the `rsv target` that `t` started: the process whose command line names
/// its directory (the harness keeps the child to itself).
fn target_pid(t: &Target) -> u32 {
    let dir = t.dir.path().to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("target") && cmd.contains(&dir)
        })
        .expect("the target's process")
}

/// Descriptors the process holds now.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A connection that closes, by a logout or by its initiator's death, leaves the
/// exposition (info, bytes and path series alike) and leaves no descriptor behind: a
/// scrape reads TCP_INFO through a duplicate of each connection's socket, which the
/// connection lets go as it ends.
#[test]
fn a_closed_connections_series_and_descriptors_go() {
    if !have("curl") {
        return;
    }
    let t = Target::start(Some(&config()));
    let pid = target_pid(&t);
    let metrics = format!("http://{}/metrics", t.metrics.as_ref().expect("metrics"));
    let scrape = || run_ok("curl", &["-sf", &metrics]);
    let series = |text: &str, name: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .count()
    };
    // Until `at_most` descriptors are held (the scrapes' own connections close a moment
    // after curl's end), or 20 s.
    let settle = |at_most: usize| {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let n = fd_count(pid);
            if n <= at_most || Instant::now() > end {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    scrape();
    let baseline = settle(0);

    let url = format!("{}?connections=2", t.url(0));
    let bench = |seconds: &str| reading(&url, seconds);
    // One session to be killed (its connections end without a logout; at the bench's
    // ERL 2 the session waits for them, without them), one that logs out at its end.
    let mut killed = bench("60");
    let mut ends = bench("4");
    let end = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = scrape();
        if series(&text, "rsv_target_connection_info") == 4 || Instant::now() > end {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        series(&text, "rsv_target_connection_info"),
        4,
        "two sessions of two connections:\n{text}"
    );
    // Every connection's path, read without asking the connection.
    assert_eq!(
        series(&text, "rsv_target_connection_srtt_seconds"),
        4,
        "{text}"
    );
    assert_eq!(series(&text, "rsv_target_connection_retransmits_total"), 4);
    let held = fd_count(pid);
    // Each connection's socket and its duplicate.
    assert!(
        held >= baseline + 8,
        "{held} descriptors with four connections, {baseline} before"
    );

    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(ends.wait().unwrap().success());
    let end = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = scrape();
        if series(&text, "rsv_target_connection_info") == 0 || Instant::now() > end {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "rsv_target_connection_info",
        "rsv_target_connection_sent_bytes_total",
        "rsv_target_connection_srtt_seconds",
        "rsv_target_connection_in_flight_bytes",
    ] {
        assert_eq!(
            series(&text, name),
            0,
            "{name} outlived its connection:\n{text}"
        );
    }
    let after = settle(baseline);
    assert_eq!(
        after, baseline,
        "descriptors after the sessions ended: {after}, before them {baseline}"
    );
}
