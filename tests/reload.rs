//! `rsv target` follows its configuration file on SIGHUP: targets added (discovery lists
//! them, logins work) and removed (logins refused with "not found", their sessions
//! closed), LUNs added and removed (REPORTED LUNS DATA HAS CHANGED, then REPORT LUNS),
//! allowed initiators changed (refused with "authorization failure"), and a file that
//! does not parse or open leaves the configuration in force as it was, with a log line
//! that names the error. The iSNS side is in tests/isns.rs.

use std::time::{Duration, Instant};

use initiator::{DataDir, Error, IscsiUrl, Session, SessionOptions};
use testkit::Target;

const A: &str = "iqn.2026-11.org.reservoir:reload-a";
const B: &str = "iqn.2026-11.org.reservoir:reload-b";
const C: &str = "iqn.2026-11.org.reservoir:reload-c";
const HOST: &str = "iqn.2026-11.org.reservoir:host";
const OTHER: &str = "iqn.2026-11.org.reservoir:other";

fn target(iqn: &str, extra: &str, luns: &[u16]) -> String {
    let mut t = format!("[[target]]\niqn = \"{iqn}\"\n{extra}");
    for id in luns {
        t.push_str(&format!(
            "[[target.lun]]\nid = {id}\nstore = \"ram:?size={}MiB\"\n",
            id + 1
        ));
    }
    t
}

fn url(t: &Target, iqn: &str) -> IscsiUrl {
    IscsiUrl::parse(&format!("iscsi://{}/{iqn}/0", t.portal)).unwrap()
}

fn as_initiator(name: &str) -> SessionOptions {
    SessionOptions {
        initiator_name: name.to_owned(),
        ..SessionOptions::default()
    }
}

async fn discovered(t: &Target) -> Vec<String> {
    let mut names: Vec<String> = initiator::discover(&url(t, A), &SessionOptions::default())
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    names.sort();
    names
}

/// The status class and detail a login is refused with.
async fn refusal(t: &Target, iqn: &str, opts: &SessionOptions) -> (u8, u8) {
    match Session::connect(&url(t, iqn), opts).await {
        Err(Error::LoginRefused { class, detail, .. }) => (class, detail),
        Err(e) => panic!("login to {iqn}: {e}"),
        Ok(_) => panic!("login to {iqn} was not refused"),
    }
}

/// REQUEST SENSE on `lun`: (key, ASC, ASCQ) of what it returns, a pending unit attention
/// (which it clears) or NO SENSE.
async fn request_sense(s: &Session, lun: u16) -> (u8, u8, u8) {
    let r = s
        .command_ok(lun, &[0x03, 0, 0, 0, 252, 0], DataDir::Read(252))
        .await
        .expect("REQUEST SENSE");
    let d = &r.data;
    assert!(d.len() >= 14, "short sense data {d:?}");
    (d[2] & 0x0f, d[12], d[13])
}

/// Takes the unit attentions pending after login (POWER ON, RESET).
async fn drain_unit_attentions(s: &Session, lun: u16) {
    for _ in 0..8 {
        if request_sense(s, lun).await.0 == 0 {
            return;
        }
    }
    panic!("unit attentions keep coming");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn reload_adds_and_removes_targets() {
    let first = format!("{}{}", target(A, "", &[0]), target(B, "", &[0]));
    let mut t = Target::start(Some(&first));
    let rt = runtime();
    assert_eq!(rt.block_on(discovered(&t)), [A, B]);
    let to_b = rt
        .block_on(Session::connect(&url(&t, B), &SessionOptions::default()))
        .unwrap();
    rt.block_on(to_b.test_unit_ready(0)).ok();

    let line = t.reload(&format!(
        "{}{}",
        target(A, "", &[0]),
        target(C, "", &[0, 1])
    ));
    assert!(
        line.contains(&format!("target {C} added"))
            && line.contains(&format!("target {B} removed")),
        "{line}"
    );
    // Discovery lists C and no longer B; C takes logins, B is "not found" (0x0203).
    assert_eq!(rt.block_on(discovered(&t)), [A, C]);
    let to_c = rt
        .block_on(Session::connect(&url(&t, C), &SessionOptions::default()))
        .unwrap();
    assert_eq!(rt.block_on(to_c.report_luns()).unwrap(), [0, 1]);
    assert_eq!(
        rt.block_on(refusal(&t, B, &SessionOptions::default())),
        (2, 3)
    );
    // The session that was logged in to B was closed.
    assert!(
        t.log().contains(&format!(
            "target {B} removed from the configuration; closing it"
        )),
        "{}",
        t.log()
    );
    // A ran on untouched.
    let to_a = rt
        .block_on(Session::connect(&url(&t, A), &SessionOptions::default()))
        .unwrap();
    assert_eq!(rt.block_on(to_a.report_luns()).unwrap(), [0]);
    rt.block_on(to_c.logout()).unwrap();
    rt.block_on(to_a.logout()).unwrap();
    drop(to_b);
    assert!(t.stop().success(), "{}", t.log());
}

#[test]
fn reload_adds_and_removes_luns_with_a_unit_attention() {
    let mut t = Target::start(Some(&target(A, "", &[0])));
    let rt = runtime();
    let s = rt
        .block_on(Session::connect(&url(&t, A), &SessionOptions::default()))
        .unwrap();
    rt.block_on(drain_unit_attentions(&s, 0));
    assert_eq!(rt.block_on(request_sense(&s, 0)), (0, 0, 0));
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), [0]);

    // LUN 1 added: REPORTED LUNS DATA HAS CHANGED (6h/3Fh/0Eh) on LUN 0, once; then REPORT
    // LUNS lists it and it serves I/O.
    let line = t.reload(&target(A, "", &[0, 1]));
    assert!(line.contains("LUN +1"), "{line}");
    assert_eq!(rt.block_on(request_sense(&s, 0)), (6, 0x3f, 0x0e));
    assert_eq!(rt.block_on(request_sense(&s, 0)), (0, 0, 0));
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), [0, 1]);
    let cap = rt.block_on(s.read_capacity(1)).unwrap();
    assert_eq!(cap.blocks * cap.block_size as u64, 2 << 20);
    let data = bytes::Bytes::from(vec![0x5a; 4096]);
    rt.block_on(s.write(1, 8, data.clone())).unwrap();
    assert_eq!(rt.block_on(s.read(1, 8, 8)).unwrap(), data);

    // LUN 0 removed: the attention on LUN 1 (LUN 0 is gone); REPORT LUNS clears it
    // where it is pending.
    let line = t.reload(&target(A, "", &[1]));
    assert!(line.contains("LUN -0"), "{line}");
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), [1]);
    assert_eq!(rt.block_on(request_sense(&s, 1)), (0, 0, 0));
    let gone = rt.block_on(s.test_unit_ready(0)).unwrap_err();
    assert!(matches!(gone, Error::LunNotFound { lun: 0, .. }), "{gone}");
    // What LUN 1 holds survived both reloads: it was kept, not reopened.
    assert_eq!(rt.block_on(s.read(1, 8, 8)).unwrap(), data);
    rt.block_on(s.logout()).unwrap();
    assert!(t.stop().success(), "{}", t.log());
}

#[test]
fn reload_changes_who_may_log_in() {
    let mut t = Target::start(Some(&target(A, "", &[0])));
    let rt = runtime();
    let other = rt
        .block_on(Session::connect(&url(&t, A), &as_initiator(OTHER)))
        .unwrap();
    rt.block_on(other.logout()).unwrap();

    let only_host = format!("allowed_initiators = [\"{HOST}\"]\n");
    let line = t.reload(&target(A, &only_host, &[0]));
    assert!(line.contains("access rules"), "{line}");
    // Authorization failure (0x0202) for the initiator left out; the one named logs in.
    assert_eq!(rt.block_on(refusal(&t, A, &as_initiator(OTHER))), (2, 2));
    let host = rt
        .block_on(Session::connect(&url(&t, A), &as_initiator(HOST)))
        .unwrap();
    rt.block_on(host.logout()).unwrap();
    // And back.
    t.reload(&target(A, "", &[0]));
    let other = rt
        .block_on(Session::connect(&url(&t, A), &as_initiator(OTHER)))
        .unwrap();
    rt.block_on(other.logout()).unwrap();
    assert!(t.stop().success(), "{}", t.log());
}

#[test]
fn a_bad_configuration_leaves_the_one_in_force() {
    let first = target(A, "", &[0]);
    let mut t = Target::start(Some(&first));
    let rt = runtime();

    // A file that does not parse: the line names file, line and key.
    let line = t.reload(&format!(
        "{}[session]\nmax_connectionz = 3\n",
        target(C, "", &[0])
    ));
    assert!(
        line.contains("refused, the configuration in force is unchanged")
            && line.contains("target.toml:7:")
            && line.contains("max_connectionz"),
        "{line}"
    );
    // One that validates but whose new LUN cannot be opened: nothing of it applies, not
    // even the target that could have been.
    let line = t.reload(&format!(
        "{}{}[[target]]\niqn = \"{B}\"\n[[target.lun]]\nid = 0\nstore = \"nosuch:?size=1MiB\"\n",
        target(A, "alias = \"renamed\"\n", &[0, 1]),
        target(C, "", &[0])
    ));
    assert!(
        line.contains("refused") && line.contains(&format!("target {B} LUN 0")),
        "{line}"
    );
    assert!(line.contains("nosuch"), "{line}");
    assert_eq!(rt.block_on(discovered(&t)), [A]);
    let s = rt
        .block_on(Session::connect(&url(&t, A), &SessionOptions::default()))
        .unwrap();
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), [0]);
    rt.block_on(s.logout()).unwrap();
    assert_eq!(
        rt.block_on(refusal(&t, C, &SessionOptions::default())),
        (2, 3)
    );
    // A good file after the bad ones applies as usual.
    let line = t.reload(&format!("{first}{}", target(C, "", &[0])));
    assert!(line.contains(&format!("target {C} added")), "{line}");
    assert_eq!(rt.block_on(discovered(&t)), [A, C]);
    assert!(t.stop().success(), "{}", t.log());
}

#[test]
fn without_a_configuration_file_there_is_nothing_to_reload() {
    let mut t = Target::start(None);
    t.signal(libc::SIGHUP);
    let end = Instant::now() + Duration::from_secs(20);
    while !t
        .log()
        .contains("SIGHUP: no --config file, nothing to reload")
    {
        assert!(t.running(), "rsv target ended on SIGHUP:\n{}", t.log());
        assert!(Instant::now() < end, "{}", t.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(t.running());
    assert!(t.stop().success(), "{}", t.log());
}
