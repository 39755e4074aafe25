//! `/metrics` of a target in this process: what raw PDUs did shows in its series, a
//! refused login under its reason, task management by function and response, and a LUN
//! a reload removed leaves the exposition.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use iscsi::login::{
    InitiatorLogin, InitiatorLoginConfig, InitiatorStep, LoginResponseView, SessionType,
};
use iscsi::negotiate::ConnectionParams;
use iscsi::pdu::*;
use targetd::config::Config;
use testkit::raw::*;

const ADMITTED: &str = "iqn.2026-11.org.reservoir:metrics-admitted";

fn config(luns: &[u16]) -> Config {
    config_with(luns, "")
}

/// With `session` as the `[session]` table.
fn config_with(luns: &[u16], session: &str) -> Config {
    let luns: String = luns
        .iter()
        .map(|id| format!("[[target.lun]]\nid = {id}\nbackstore = \"ram\"\nsize = \"16MiB\"\n"))
        .collect();
    let toml = format!(
        r#"
portals = ["127.0.0.1:0"]
[session]
{session}
[metrics]
listen = "127.0.0.1:0"
[[target]]
iqn = "{IQN}"
[[target.initiator]]
name = "{ADMITTED}"
{luns}"#
    );
    Config::parse(&toml, "test").unwrap()
}

/// A target serving on a runtime of its own: its portal, its metrics address, the
/// runtime's handle and what reloads it.
fn start(
    config: Config,
) -> (
    SocketAddr,
    SocketAddr,
    tokio::runtime::Handle,
    targetd::server::Reloader,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let handle = rt.handle().clone();
        rt.block_on(async move {
            let server = targetd::Server::bind(config, &backstore::Registry::with_builtins())
                .await
                .unwrap();
            tx.send((
                server.portals()[0],
                server.metrics_addr().unwrap(),
                handle,
                server.reloader(),
            ))
            .unwrap();
            server
                .run(std::future::pending(), Duration::from_secs(1))
                .await
                .unwrap();
        });
    });
    rx.recv().unwrap()
}

/// GET /metrics in OpenMetrics: the exposition as a map from series (name and labels) to
/// value.
fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\
          Accept: application/openmetrics-text; version=1.0.0\r\n\r\n",
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

fn lun(name: &str, lun: u16, more: &str) -> String {
    let more = if more.is_empty() {
        String::new()
    } else {
        format!(",{more}")
    };
    format!("{name}{{target=\"{IQN}\",lun=\"{lun}\"{more}}}")
}

/// A login as `initiator`, which the target refuses: its status.
fn refused_login(addr: SocketAddr, initiator: &str) -> (u8, u8) {
    let mut raw = Raw {
        s: TcpStream::connect(addr).unwrap(),
        dec: iscsi::framing::PduDecoder::new(Default::default()),
        buf: Default::default(),
        cmdsn: 1,
        statsn: 0,
        tsih: 0,
        params: prefs(),
        conn: ConnectionParams::default(),
        pacing: iscsi::negotiate::TargetPacing::NotAsked,
    };
    raw.s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut login = InitiatorLogin::new(InitiatorLoginConfig {
        initiator_name: initiator.into(),
        initiator_alias: None,
        target_name: Some(IQN.into()),
        session_type: SessionType::Normal,
        isid: [0x80, 0, 0, 0, 0, 9],
        tsih: 0,
        cid: 1,
        auth: None,
        session: prefs(),
        connection: ConnectionParams::default(),
        leading: true,
        pacing_hint: None,
        start_hint: None,
        probe_hint: None,
    });
    let mut rng = |b: &mut [u8]| b.fill(7);
    let mut out = login.start(&mut rng);
    loop {
        raw.send(&Pdu::LoginRequest(out.clone().into_pdu(1, 1, 0)));
        let Pdu::LoginResponse(r) = raw.recv() else {
            panic!("expected a login response")
        };
        match login.on_response(&LoginResponseView::from(&r), &mut rng) {
            InitiatorStep::Send(next) => out = next,
            InitiatorStep::Done(_) => panic!("{initiator} logged in"),
            InitiatorStep::Failed(_) => return (r.status_class, r.status_detail),
        }
    }
}

fn tmf(c: &mut Raw, itt: u32, function: u8, referenced: u32) -> u8 {
    c.tmf_on(0, itt, function, referenced, 0, 0)
}

#[test]
fn commands_refusals_and_task_management_show_in_the_series() {
    let (portal, metrics, rt, reloader) = start(config(&[0, 1]));
    let before = scrape(metrics);
    assert_eq!(
        before[&lun("rsv_target_lun_commands_total", 0, "op=\"read\"")],
        0.0
    );
    assert_eq!(
        before["rsv_target_logins_refused_total{reason=\"not_admitted\"}"],
        0.0
    );
    assert_eq!(before["rsv_target_sessions"], 0.0);

    let mut c = Raw::login_as(
        portal,
        ADMITTED,
        [0x80, 0, 0, 0, 0, 1],
        0,
        1,
        1,
        prefs(),
        None,
    );
    clear_ua(&mut c, 1); // TEST UNIT READY: CHECK CONDITION, UNIT ATTENTION
    assert_eq!(read_at(&mut c, 2, 0, 2).len(), 1024);
    write_at(&mut c, 3, 8, &[5u8; 512]);
    // Past the end of the 16 MiB LUN: CHECK CONDITION, ILLEGAL REQUEST.
    let past = c.scsi(4, c.cmdsn, &read10(40_000, 1), true, false, 512, &[]);
    c.cmdsn += 1;
    c.send(&past);
    let Pdu::ScsiResponse(r) = c.recv() else {
        panic!("expected a SCSI Response")
    };
    assert_eq!(r.status, 2);
    assert_eq!(
        refused_login(portal, "iqn.2026-11.org.reservoir:stranger"),
        (2, 2)
    );
    assert_eq!(tmf(&mut c, 5, 1, 0x7777), 1, "ABORT TASK of no task");
    assert_eq!(tmf(&mut c, 6, 5, 0xffff_ffff), 0, "LOGICAL UNIT RESET");

    let m = scrape(metrics);
    let at = |name: &str, more: &str| {
        let key = lun(name, 0, more);
        *m.get(&key).unwrap_or_else(|| panic!("no {key} in {m:#?}"))
    };
    assert_eq!(at("rsv_target_lun_commands_total", "op=\"read\""), 2.0);
    assert_eq!(at("rsv_target_lun_commands_total", "op=\"write\""), 1.0);
    assert_eq!(at("rsv_target_lun_commands_total", "op=\"flush\""), 0.0);
    assert_eq!(at("rsv_target_lun_commands_total", "op=\"other\""), 1.0);
    assert_eq!(at("rsv_target_lun_bytes_total", "op=\"read\""), 1024.0);
    assert_eq!(at("rsv_target_lun_bytes_total", "op=\"write\""), 512.0);
    assert_eq!(
        at(
            "rsv_target_lun_command_duration_seconds_count",
            "op=\"read\""
        ),
        2.0
    );
    // The encoder puts `le` first.
    let inf = format!(
        "rsv_target_lun_command_duration_seconds_bucket{{le=\"+Inf\",target=\"{IQN}\",lun=\"0\",op=\"write\"}}"
    );
    assert_eq!(m[&inf], 1.0);
    assert_eq!(
        at(
            "rsv_target_lun_check_conditions_total",
            "sense_key=\"illegal_request\""
        ),
        1.0
    );
    assert_eq!(
        at(
            "rsv_target_lun_check_conditions_total",
            "sense_key=\"unit_attention\""
        ),
        1.0
    );
    assert!(!m.contains_key(&lun(
        "rsv_target_lun_check_conditions_total",
        0,
        "sense_key=\"medium_error\""
    )));
    assert_eq!(at("rsv_target_lun_commands_in_flight", ""), 0.0);
    // LUN 1 saw nothing.
    assert_eq!(
        m[&lun("rsv_target_lun_commands_total", 1, "op=\"read\"")],
        0.0
    );
    assert_eq!(
        m["rsv_target_logins_refused_total{reason=\"not_admitted\"}"],
        1.0
    );
    assert_eq!(m["rsv_target_logins_refused_total{reason=\"auth\"}"], 0.0);
    assert_eq!(
        m["rsv_target_task_management_total{function=\"abort_task\",response=\"no_task\"}"],
        1.0
    );
    assert_eq!(
        m["rsv_target_task_management_total{function=\"logical_unit_reset\",response=\"complete\"}"],
        1.0
    );
    assert_eq!(m["rsv_target_sessions"], 1.0);
    assert_eq!(
        m["rsv_target_limits_reached_total{limit=\"max_sessions\"}"],
        0.0
    );

    // A reload without LUN 1: its series go; LUN 0's run on, counts kept.
    let summary = rt
        .block_on(async {
            tokio::task::block_in_place(|| {
                reloader.reload(&config(&[0]), &backstore::Registry::with_builtins())
            })
        })
        .unwrap();
    assert!(summary.contains('1'), "{summary}");
    let m = scrape(metrics);
    assert!(
        !m.keys().any(|k| k.contains("lun=\"1\"")),
        "LUN 1 still in {m:#?}"
    );
    assert_eq!(
        m[&lun("rsv_target_lun_commands_total", 0, "op=\"read\"")],
        2.0
    );
}

/// At the cap, the LUNs past it are left out of the scrape (and the log says so once).
#[test]
fn the_series_cap_leaves_luns_out() {
    let mut config = config(&[0, 1, 2]);
    // Room for one LUN's series and a bit.
    config.metrics.as_mut().unwrap().max_series = 150;
    let (_, metrics, _, _) = start(config);
    let m = scrape(metrics);
    assert!(m.keys().any(|k| k.contains("lun=\"0\"")));
    assert!(!m
        .keys()
        .any(|k| k.contains("lun=\"1\"") || k.contains("lun=\"2\"")));
}

/// `max_sessions` reached: the login is refused for a limit, and the limit counted.
#[test]
fn a_limit_reached_is_counted_with_the_refusal() {
    let (portal, metrics, _, _) = start(config_with(&[0], "max_sessions = 1"));
    let _first = Raw::login_as(
        portal,
        ADMITTED,
        [0x80, 0, 0, 0, 0, 1],
        0,
        1,
        1,
        prefs(),
        None,
    );
    // Another initiator port: a new session, one too many (0302h, out of resources).
    assert_eq!(refused_login(portal, ADMITTED), (3, 2));
    let m = scrape(metrics);
    assert_eq!(
        m["rsv_target_limits_reached_total{limit=\"max_sessions\"}"],
        1.0
    );
    assert_eq!(m["rsv_target_logins_refused_total{reason=\"limit\"}"], 1.0);
    assert_eq!(m["rsv_target_sessions"], 1.0);
}
