//! The initiator against Reservoir's own target (the `rsv` binary), with many connections
//! per session.

mod common;

use clap::Parser;
use common::*;
use initiator::cli::{self, CpArgs, SessionFlags};
use initiator::IscsiUrl;

const MIB: u64 = 1 << 20;

macro_rules! rsv_or_skip {
    () => {
        match RsvTarget::start(&[]) {
            Some(t) => t,
            None => {
                eprintln!("SKIP: no rsv binary (cargo build -p rsv, or set RSV_BIN)");
                return;
            }
        }
    };
}

#[derive(Parser)]
struct CpCli {
    #[command(flatten)]
    args: CpArgs,
}

fn cp_args(args: &[&str]) -> CpArgs {
    CpCli::parse_from(std::iter::once("cp").chain(args.iter().copied())).args
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn ls_and_inq() {
    let t = rsv_or_skip!();
    let rt = rt();
    let portal = IscsiUrl::parse(&format!("iscsi://{}/", t.portal)).unwrap();
    let listing = rt
        .block_on(cli::list(&portal, &SessionFlags::default()))
        .unwrap();
    let target = listing
        .iter()
        .find(|l| l.target == t.iqn)
        .expect("our target");
    let lun0 = target.luns.iter().find(|l| l.lun == 0).expect("LUN 0");
    assert_eq!(lun0.device_type, "disk");
    assert!(lun0.size_bytes.unwrap() >= 256 * MIB);
    let url = IscsiUrl::parse(&format!("iscsi://{}/{}/0", t.portal, t.iqn)).unwrap();
    let inq = rt
        .block_on(cli::inquire(&url, &SessionFlags::default()))
        .unwrap();
    assert_eq!(inq.standard.device_type, 0);
    assert!(inq.serial.is_some());
    assert!(inq.block_limits.is_some());
}

#[test]
fn cp_with_eight_connections_and_verify() {
    let t = rsv_or_skip!();
    let size = 128 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file(&img, size as usize, 3);
    let url = format!("iscsi://{}/{}/0", t.portal, t.iqn);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--connections",
            "8",
            "--queue-depth",
            "32",
            "--verify",
        ])))
        .unwrap();
    assert_eq!(s.sessions[0].connections, 8, "{:?}", s.sessions[0]);
    assert!(s.verified);
    // The LUN is larger than the image: read back only the image's length.
    let lun_back = dir.path().join("lun");
    let s2 = rt()
        .block_on(cli::copy(&cp_args(&[
            &url,
            lun_back.to_str().unwrap(),
            "--connections",
            "8",
        ])))
        .unwrap();
    assert!(s2.bytes >= size);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&lun_back)
        .unwrap();
    f.set_len(size).unwrap();
    std::fs::rename(&lun_back, &back).unwrap();
    assert!(same_files(&img, &back));
}

#[test]
fn cp_with_one_connection_survives_a_cut_by_session_reinstatement() {
    let t = rsv_or_skip!();
    let size = 64 * MIB;
    let proxy = CuttingProxy::start(t.portal.clone(), 4 * MIB as usize);
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    random_file(&img, size as usize, 4);
    let url = format!("iscsi://{}/{}/0?connections=1", proxy.portal, t.iqn);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--verify",
        ])))
        .unwrap();
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(s.reinstatements >= 1, "{s:?}");
    assert!(s.verified);
}

/// One of four connections is cut mid-copy: the session goes on over the other three,
/// the lost commands are issued again there, and the connection comes back with the same
/// TSIH and CID — no session reinstatement.
#[test]
fn cp_with_four_connections_recovers_a_cut_connection_alone() {
    let t = rsv_or_skip!();
    let size = 64 * MIB;
    let proxy = CuttingProxy::start(t.portal.clone(), 4 * MIB as usize);
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("image");
    let back = dir.path().join("back");
    random_file(&img, size as usize, 5);
    let url = format!("iscsi://{}/{}/0?connections=4", proxy.portal, t.iqn);
    let s = rt()
        .block_on(cli::copy(&cp_args(&[
            img.to_str().unwrap(),
            &url,
            "--verify",
        ])))
        .unwrap();
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(s.reinstatements, 0, "{s:?}");
    assert!(s.retries >= 1, "the cut lost no command? {s:?}");
    assert!(s.verified);
    // Byte for byte, through the target directly.
    let direct = format!("iscsi://{}/{}/0", t.portal, t.iqn);
    rt().block_on(cli::copy(&cp_args(&[&direct, back.to_str().unwrap()])))
        .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&back)
        .unwrap()
        .set_len(size)
        .unwrap();
    assert!(same_files(&img, &back));
}
