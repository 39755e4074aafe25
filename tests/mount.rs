//! `rsv mount` end to end: a LUN of Reservoir's target as a FUSE file, a loop device on
//! it, ext4 on that, files written, everything unmounted, mounted again and the files
//! verified. Needs root, /dev/fuse and loop devices; skips without them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::*;

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{cmd} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Retries for a few seconds: a loop device lets go of its file asynchronously.
fn retry(cmd: &str, args: &[&str]) -> Result<String, String> {
    let start = Instant::now();
    loop {
        match run(cmd, args) {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() > Duration::from_secs(10) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn why_skip() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices (/dev/loop-control)".into());
    }
    for cmd in ["losetup", "mkfs.ext4", "mount", "umount", "fusermount3"] {
        if !Path::new("/usr/sbin").join(cmd).exists() && !have(cmd) {
            return Some(format!("no {cmd}"));
        }
    }
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (losetup and mount need it)".into());
    }
    if let Err(e) = run("losetup", &["-f"]) {
        return Some(format!("no free loop device: {e}"));
    }
    None
}

/// One `rsv mount` with the loop device and ext4 mount on top of it. Dropping it tears
/// down whatever is still set up, in order, so a failing test leaves nothing behind.
struct Stack {
    child: Option<Child>,
    file: PathBuf,
    loopdev: Option<String>,
    mnt: Option<PathBuf>,
}

impl Stack {
    fn mount(bin: &Path, url: &str, file: &Path, size: u64) -> Stack {
        let child = Command::new(bin)
            .args(["mount", url])
            .arg(file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rsv mount");
        let mut s = Stack {
            child: Some(child),
            file: file.to_owned(),
            loopdev: None,
            mnt: None,
        };
        let start = Instant::now();
        while std::fs::metadata(file).map(|m| m.len()).unwrap_or(0) != size {
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("rsv mount exited early: {st}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "rsv mount did not show the LUN on {}",
                file.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn attach_and_mount(&mut self, mnt: &Path, mkfs: bool) {
        let dev = run("losetup", &["-f", "--show", self.file.to_str().unwrap()]).unwrap();
        self.loopdev = Some(dev.clone());
        if mkfs {
            run("mkfs.ext4", &["-q", &dev]).unwrap();
        }
        run("mount", &[&dev, mnt.to_str().unwrap()]).unwrap();
        self.mnt = Some(mnt.to_owned());
    }

    fn detach(&mut self) -> Result<(), String> {
        if let Some(m) = self.mnt.take() {
            retry("umount", &[m.to_str().unwrap()])?;
        }
        if let Some(d) = self.loopdev.take() {
            retry("losetup", &["-d", &d])?;
        }
        Ok(())
    }

    /// Ends `rsv mount` the way a person would: `fusermount3 -u` or SIGTERM. Its exit
    /// status tells whether it flushed and logged out cleanly.
    fn finish(&mut self, by_signal: bool) -> Result<(), String> {
        self.detach()?;
        let pid = self.child.as_ref().unwrap().id();
        if by_signal {
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        } else {
            retry("fusermount3", &["-u", self.file.to_str().unwrap()])?;
        }
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("rsv mount exited with {st}"))
                };
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("rsv mount did not exit after unmount".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(m) = self.mnt.take() {
            let _ = run("umount", &["-l", m.to_str().unwrap()]);
        }
        if let Some(d) = self.loopdev.take() {
            let _ = retry("losetup", &["-d", &d]);
        }
        if let Some(mut c) = self.child.take() {
            let _ = run("fusermount3", &["-u", "-z", self.file.to_str().unwrap()]);
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_millis(500));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn content(i: usize) -> Vec<u8> {
    random_bytes(1000 + i * 37_000, i as u64)
}

/// The `rsv` binary, with `mount`; None (after saying why) where the test cannot run.
fn mount_bin() -> Option<PathBuf> {
    if let Some(why) = why_skip() {
        skip(&why);
        return None;
    }
    let bin = rsv();
    let help = Command::new(&bin)
        .args(["mount", "--help"])
        .output()
        .unwrap();
    assert!(
        help.status.success(),
        "{} has no `mount` subcommand; rebuild it (cargo build -p rsv)",
        bin.display()
    );
    Some(bin)
}

/// `rsv mount` of `url`, a loop device and ext4 on it, 40 files written, everything
/// unmounted (by fusermount3), mounted again and the files verified, then unmounted by
/// SIGTERM.
fn ext4_round_trip(bin: &Path, url: &str) {
    let size: u64 = run(bin.to_str().unwrap(), &["inq", url, "--json"])
        .map(|j| {
            let v: serde_json::Value = serde_json::from_str(&j).unwrap();
            let c = &v["capacity"];
            c["blocks"].as_u64().unwrap() * c["block_size"].as_u64().unwrap()
        })
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun0");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();

    let mut s = Stack::mount(bin, url, &file, size);
    s.attach_and_mount(&mnt, true);
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..40 {
        std::fs::write(mnt.join("d").join(format!("f{i}")), content(i)).unwrap();
    }
    run("sync", &[]).unwrap();
    s.finish(false).unwrap();
    drop(s);
    assert!(
        std::fs::metadata(&file).unwrap().len() != size,
        "the FUSE file is still mounted"
    );

    let mut s = Stack::mount(bin, url, &file, size);
    s.attach_and_mount(&mnt, false);
    for i in 0..40 {
        let got = std::fs::read(mnt.join("d").join(format!("f{i}"))).unwrap();
        assert!(got == content(i), "file f{i} differs after remount");
    }
    s.finish(true).unwrap();
}

#[test]
fn ext4_on_a_fuse_mounted_lun() {
    let Some(bin) = mount_bin() else { return };
    let t = Target::with_args(&[]);
    ext4_round_trip(&bin, &t.url(0));
}

/// Data Reservoir's file server: `rsv target --stripe` over four disk-server targets
/// (each its default 1 GiB sparse file LUN), mounted with `rsv mount`, ext4 made on the
/// 4 GiB volume, files written, remounted and verified; every disk server then holds a
/// share of the data, not one of them all of it.
#[test]
fn ext4_on_a_volume_striped_over_four_disk_servers() {
    let Some(bin) = mount_bin() else { return };
    let disks: Vec<Target> = (0..4).map(|_| Target::with_args(&[])).collect();
    let allocated = |d: &Target| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(d.data_dir().join("lun0.img"))
            .unwrap()
            .blocks()
            * 512
    };
    let before: Vec<u64> = disks.iter().map(allocated).collect();
    let members: Vec<String> = disks.iter().map(|d| d.url(0)).collect();
    let server = Target::with_args(&["--stripe", &members.join(","), "--stripe-unit", "64K"]);
    ext4_round_trip(&bin, &server.url(0));
    drop(server);
    let after: Vec<u64> = disks.iter().map(allocated).collect();
    eprintln!("bytes allocated on each disk server: before {before:?}, after {after:?}");
    let total: u64 = after.iter().sum();
    // 40 files of 1 KB..1.4 MB, 27.5 MiB in all, plus the file system's own metadata.
    assert!(total > 27 << 20, "{after:?}");
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        assert!(
            a - b > total / 8,
            "disk server {i} got {} of {total} bytes: {after:?}",
            a - b
        );
    }
}
