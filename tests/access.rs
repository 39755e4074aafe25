//! Access rules that hold on every path.
//!
//! LUN masking: an initiator masked to LUN 1 walks the whole command
//! set (every opcode and service action REPORT SUPPORTED OPERATION CODES lists, with no
//! data, reading and writing) against LUN 1, against the hidden LUN 0 and against a LUN
//! that does not exist, then EXTENDED COPY and persistent reservations crafted to reach
//! LUN 0 (`testkit::walk`). It reads none of LUN 0's bytes, changes neither them nor its
//! reservations, and learns nothing of it that a LUN that does not exist would not
//! answer. On a file LUN and a stripe LUN, through raw PDUs, Reservoir's initiator and
//! libiscsi; tests/rbd.rs runs the same walk on an RBD LUN. A reload that stops admitting
//! an initiator closes its session rather than widening its view, and takes a LUN it
//! removes from the sync agent too. Credentials in store
//! specs and CHAP secrets are neither printed by `--check` nor logged.

use testkit::output::said;
use testkit::walk::{walk, Client, Dir, Layout, Libiscsi, Ours, RawPdus, ADMIN, MASKED};
use testkit::{have, Target};

const IQN: &str = "iqn.2026-11.org.reservoir:masked";

fn config(hidden_store: &str) -> String {
    format!(
        r#"
[[target]]
iqn = "{IQN}"
[[target.initiator]]
name = "{ADMIN}"
[[target.initiator]]
name = "{MASKED}"
luns = [1]
[[target.lun]]
id = 0
store = "{hidden_store}"
[[target.lun]]
id = 1
store = "file:visible.img?size=8MiB"
"#
    )
}

const LAYOUT: Layout = Layout {
    visible: 1,
    hidden: 0,
    absent: 9,
    block_size: 512,
};

fn walk_every_client(hidden_store: &str) {
    let target = Target::start(Some(&config(hidden_store)));
    let mut admin = Ours::login(&target.portal, IQN, ADMIN);
    let mut masked = RawPdus::login(&target.portal, IQN, MASKED);
    let r = walk(&mut masked, &mut admin, &LAYOUT);
    eprintln!(
        "{hidden_store}: raw PDUs walked {} commands ({} opcodes and service actions, LUNs \
         named by every address method): 0 cross-LU reads or writes",
        r.commands, r.opcodes
    );
    let mut masked = Ours::login(&target.portal, IQN, MASKED);
    let r = walk(&mut masked, &mut admin, &LAYOUT);
    eprintln!(
        "{hidden_store}: Reservoir's initiator walked {} commands ({} opcodes and service \
         actions): 0 cross-LU reads or writes",
        r.commands, r.opcodes
    );
    if !have("cc") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = Libiscsi::build(dir.path());
    let mut masked = Libiscsi::login(&bin, &target.portal, IQN, MASKED, 1);
    let r = walk(&mut masked, &mut admin, &LAYOUT);
    eprintln!(
        "{hidden_store}: libiscsi walked {} commands ({} opcodes and service actions): 0 \
         cross-LU reads or writes",
        r.commands, r.opcodes
    );
}

#[test]
fn masked_initiator_cannot_reach_a_hidden_file_lun() {
    walk_every_client("file:hidden.img?size=8MiB");
}

#[test]
fn masked_initiator_cannot_reach_a_hidden_stripe_lun() {
    walk_every_client("stripe:?unit=64KiB&members=[file:m0.img?size=4MiB,ram:?size=4MiB]");
}

/// Masked to LUN 1, then the reload names the initiator no more (only the admin may log
/// in): its session is closed, not left seeing every LUN as an unlisted initiator of an
/// open target would.
#[test]
fn a_reload_that_stops_admitting_an_initiator_closes_its_session() {
    let mut target = Target::start(Some(&config("file:hidden.img?size=8MiB")));
    // Recovery gives up soon: the target refuses its logins from now on.
    let opts = initiator::SessionOptions {
        recovery_timeout: std::time::Duration::from_secs(2),
        command_timeout: std::time::Duration::from_secs(2),
        ..Default::default()
    };
    let mut masked = Ours::login_with(&target.portal, IQN, MASKED, opts);
    let tur = [0u8; 6];
    let a = Client::cmd(&mut masked, 1, &tur, &Dir::None).unwrap();
    assert_eq!(a.status, 0);
    let without = config("file:hidden.img?size=8MiB").replace(
        &format!("[[target.initiator]]\nname = \"{MASKED}\"\nluns = [1]\n"),
        "",
    );
    assert!(!without.contains(MASKED));
    target.reload(&without);
    assert!(
        target.log().contains("no longer admitted"),
        "no session closed:\n{}",
        target.log()
    );
    // Whatever it sends now, LUN 0's data does not come back to it.
    let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let r = Client::cmd(&mut masked, 0, &read, &Dir::Read(512));
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|a| a.status != 0),
        "a session no longer admitted read LUN 0: {r:?}"
    );
}

/// The sync agent (`[control]`) reaches the LUNs the target has now: one a reload
/// removed is neither listed by /v1/luns nor sent by /v1/send, as one never configured.
#[test]
fn the_sync_agent_serves_the_luns_the_target_has_now() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("control.key");
    std::fs::write(&key_path, "a shared key of more than 16 bytes").unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let control = format!(
        "[control]\nlisten = \"127.0.0.1:0\"\nkey_file = \"{}\"\n",
        key_path.display()
    );
    let two = format!("{control}{}", config("file:hidden.img?size=8MiB"));
    let mut target = Target::start(Some(&two));
    let agent = replicate::wire::Client::new(
        target.control.clone().expect("the agent's address"),
        replicate::auth::Key::from_file(&key_path).unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listed = |rt: &tokio::runtime::Runtime| -> Vec<u16> {
        let luns: replicate::api::Luns = rt.block_on(agent.call("GET", "/v1/luns", &())).unwrap();
        luns.luns.iter().map(|l| l.lun).collect()
    };
    assert_eq!(listed(&rt), [0, 1]);
    let dest = format!("iscsi://{}/{IQN}/1", target.portal);
    let send = |rt: &tokio::runtime::Runtime, lun: u16| {
        let req = replicate::api::SendRequest {
            iqn: IQN.into(),
            lun,
            dest: dest.clone(),
            unit: 1 << 20,
            what: replicate::api::What::Units(vec![(0, 0)]),
            skip_units: 0,
            pacing: None,
            session: Vec::new(),
            compress: Default::default(),
            cut: None,
            also: Vec::new(),
        };
        rt.block_on(agent.call::<replicate::api::SendStarted>("POST", "/v1/send", &req))
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
    };
    send(&rt, 0).expect("a send of no units from LUN 0");
    let one = two.replace(
        "[[target.lun]]\nid = 0\nstore = \"file:hidden.img?size=8MiB\"\n",
        "",
    );
    assert!(!one.contains("hidden.img"));
    target.reload(&one);
    assert_eq!(listed(&rt), [1]);
    let e = send(&rt, 0).unwrap_err();
    assert!(e.contains("no LUN 0 of target"), "{e}");
}

/// Passwords in store specs (an `iscsi://user%password@` member, `target_secret`) and
/// CHAP secrets: `rsv target --check` prints the configuration and each LUN's store
/// without them, and a target that fails to open such a store says why without them.
#[test]
fn credentials_are_neither_shown_by_check_nor_logged() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = [
        "pw-secret-one",
        "pw-secret-two",
        "pw-secret-three",
        "pw-secret-four",
    ];
    let config = format!(
        r#"
data_dir = "{data}"
[[target]]
iqn = "{IQN}"
chap = {{ user = "walker", secret = "{s3}", mutual_user = "t", mutual_secret = "{s4}" }}
[[target.lun]]
id = 0
store = "stripe:?unit=64KiB&members=[file:a.img?size=4MiB,iscsi://walker%25{s1}@127.0.0.1:1/iqn.2026-11.org.reservoir:none/0?target_secret={s2}]"
"#,
        data = dir.path().join("data").display(),
        s1 = secrets[0],
        s2 = secrets[1],
        s3 = secrets[2],
        s4 = secrets[3],
    );
    let path = dir.path().join("target.toml");
    std::fs::write(&path, config).unwrap();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(testkit::rsv())
            .args(["target", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        let text = said(&out);
        (out.status, text)
    };
    let (_, check) = run(&["--check"]);
    // The run that opens the store: the remote member cannot be reached, so the target
    // stops with an error naming the store.
    let (status, start) = run(&[]);
    assert!(
        !status.success(),
        "the target started without its remote member:\n{start}"
    );
    for (what, text) in [("--check", &check), ("a failed start", &start)] {
        assert!(
            text.contains("walker"),
            "{what} says nothing of the store:\n{text}"
        );
        for s in secrets {
            assert!(!text.contains(s), "{what} shows {s}:\n{text}");
        }
    }
}
