//! DR's file-system application (`rsv-lab run dr --app ext4`): the volume carries an ext4
//! file system, written at the primary site through `rsv mount` (the LUN as a FUSE file)
//! and a loop device, by a writer that keeps replacing files (write a temporary file,
//! fsync every other one, rename it over the old name; now and then a directory fsync or
//! an unlink). After each promote the far copy is attached the same way and treated as a
//! failover treats it: mounted (the kernel replays the journal, as the application's host
//! at the far site would on its first mount) and unmounted, its files read back, then
//! `e2fsck -fn` must find it clean.
//!
//! Why mount and not `e2fsck -E journal_only`: a real failover mounts the copy; the mount
//! also runs the orphan list, which `e2fsck -n` would otherwise count against the copy.
//!
//! `rsv mount` runs in the site's network namespace through `nsenter --net` (not `ip netns
//! exec`, which gives the command a mount namespace of its own): the FUSE file, the loop
//! device and the ext4 mount are then visible to the lab, which runs the writer and the
//! checks in its own mount namespace.
//!
//! `RSV_DR_FS_CORRUPT=1` clears an inode (lost+found's) on every far copy after its
//! journal is replayed and before `e2fsck -fn` runs: the check of the check, the run must
//! then report violations.

use crate::proc::{self, rsv_bin, unix_now, Proc};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Bytes of a block of a file's content; each starts with its own tag.
const BLOCK: usize = 4096;
/// Directories the writer spreads its files over (rename and unlink across many).
const DIRS: u64 = 16;
/// The tag at the head of every block: magic, slot, generation, block index, file length.
const MAGIC: &[u8; 4] = b"DRFS";

/// The programs the ext4 application needs beside `rsv`.
pub const TOOLS: &[&str] = &[
    "nsenter",
    "losetup",
    "mkfs.ext4",
    "e2fsck",
    "debugfs",
    "mount",
    "umount",
];

/// Gives this process (its calling thread, which spawns every child of the run) a mount
/// namespace of its own before anything is mounted. Without it, every process that
/// unshares its mounts while ours exist (each `ip netns exec` of this run or of anyone
/// else's) keeps a copy of our ext4 and FUSE mounts: unmounting ours then leaves the file
/// system alive in those copies, its loop device bound and, once `rsv mount` is gone, its
/// journal thread waiting on the dead FUSE file. Our namespace is the host's slave (the
/// host's mounts still reach us, ours never reach the host) and shared with the
/// namespaces our children make, so our unmounts reach their copies too.
pub fn own_mount_namespace() -> Result<()> {
    let root = c"/";
    // SAFETY: unshare(2) and mount(2) with valid constant arguments; they change only the
    // mounts this process and its later children see.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            bail!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
        }
        for flags in [
            libc::MS_REC | libc::MS_SLAVE,
            libc::MS_REC | libc::MS_SHARED,
        ] {
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                bail!(
                    "making / slave and shared in the run's mount namespace: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    Ok(())
}

/// Runs a system tool to its end; its stdout, or an error with both outputs.
fn sh(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Retries `sh` for a few seconds: a loop device and a mount let go asynchronously.
fn sh_retry(program: &str, args: &[&str]) -> Result<String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match sh(program, args) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > end => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A site's volume attached here: `rsv mount` in the site's network namespace, a loop
/// device on its file, and (while mounted) ext4 on the loop device. Dropping it tears
/// down what is left, lazily, so an error leaves nothing mounted.
pub struct Stack {
    mount: Option<Proc>,
    file: PathBuf,
    pub dev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
    /// `rsv mount` was started on `file`.
    fuse: bool,
}

impl Stack {
    /// `rsv mount URL` of the volume in namespace `ns` on `dir/TAG.lun`, then a loop device.
    pub fn attach(ns: &str, url: &str, size: u64, dir: &Path, tag: &str) -> Result<Stack> {
        let file = dir.join(format!("{tag}.lun"));
        let mnt = dir.join(format!("{tag}.mnt"));
        std::fs::create_dir_all(&mnt)?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{ns}"))
            .arg(rsv_bin())
            .args(["mount", url])
            .arg(&file)
            .env("RSV_PATH_CACHE", "off");
        let mount = Proc::spawn(cmd, "rsv mount", &dir.join(format!("mount-{tag}.log")))?;
        let mut s = Stack {
            mount: Some(mount),
            file,
            dev: None,
            mnt,
            mounted: false,
            fuse: true,
        };
        let end = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(&s.file).map(|m| m.len()).unwrap_or(0) != size {
            let m = s.mount.as_mut().expect("just spawned");
            if !m.alive() {
                bail!("rsv mount exited:\n{}", proc::tail(&m.log_text(), 1500));
            }
            if Instant::now() > end {
                bail!("rsv mount did not show {url} on {}", s.file.display());
            }
            proc::sleep(Duration::from_millis(20))?;
        }
        let file = s.file.to_string_lossy().into_owned();
        s.dev = Some(sh("losetup", &["-f", "--show", &file])?);
        Ok(s)
    }

    fn dev(&self) -> &str {
        self.dev.as_deref().unwrap_or("")
    }

    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// A new file system on the volume: every inode table and the journal written now, so
    /// that no lazy initialisation writes behind the application.
    pub fn mkfs(&self) -> Result<()> {
        sh(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                self.dev(),
            ],
        )
        .map(|_| ())
    }

    /// Mounts the file system (replaying its journal if it has one to replay).
    pub fn mount(&mut self) -> Result<()> {
        let mnt = self.mnt.to_string_lossy().into_owned();
        sh("mount", &["-t", "ext4", self.dev(), &mnt])?;
        self.mounted = true;
        Ok(())
    }

    pub fn umount(&mut self) -> Result<()> {
        if self.mounted {
            sh_retry("umount", &[&self.mnt.to_string_lossy()])?;
            self.mounted = false;
        }
        Ok(())
    }

    /// The application's host lost with its site: `rsv mount` SIGKILLed (its FUSE
    /// connection aborts, so nothing more reaches the LUN), then the dead mounts and the
    /// loop device let go of, lazily.
    pub fn crash(&mut self) {
        if let Some(mut m) = self.mount.take() {
            m.sigkill();
        }
        self.let_go();
    }

    fn let_go(&mut self) {
        if self.mounted {
            let _ = sh("umount", &["-l", &self.mnt.to_string_lossy()]);
            self.mounted = false;
        }
        if let Some(d) = self.dev.take() {
            // A busy loop device is cleared once its last user goes (the kernel's
            // autoclear), so this does not wait for the lazy unmount.
            let _ = sh_retry("losetup", &["-d", &d]);
        }
        if let Some(mut m) = self.mount.take() {
            // SIGTERM unmounts the FUSE file after flushing.
            m.stop();
        }
        if std::mem::take(&mut self.fuse) {
            // After a SIGKILL the FUSE file stays mounted, dead (its stat fails), until
            // unmounted; after a SIGTERM `rsv mount` has unmounted it and this fails,
            // harmlessly.
            let _ = sh("umount", &["-l", &self.file.to_string_lossy()]);
        }
    }

    /// Unmounts and detaches in order: the file system, the loop device, `rsv mount`.
    pub fn close(mut self) -> Result<()> {
        self.umount()?;
        if let Some(d) = self.dev.take() {
            sh_retry("losetup", &["-d", &d])?;
        }
        self.let_go();
        Ok(())
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.let_go();
    }
}

/// What the check of a far copy found.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct FsCheck {
    /// The mount that replays the journal succeeded.
    pub mounted: bool,
    /// Files read back, and those whose content is not the writer's (a block of another
    /// file or generation, or bytes the writer never wrote).
    pub files: u64,
    pub bad_files: Vec<String>,
    /// `e2fsck -fn`'s exit code (0: clean) and, when not clean, its output.
    pub fsck_exit: Option<i32>,
    pub fsck_output: String,
    /// `RSV_DR_FS_CORRUPT`: an inode was cleared before the check.
    #[serde(default)]
    pub corrupted: bool,
    /// Seconds: mount and unmount (the journal replay), reading the files, e2fsck.
    pub replay_s: f64,
    pub files_s: f64,
    pub fsck_s: f64,
}

impl FsCheck {
    /// Why the copy is not what a failover must find, or None.
    pub fn violation(&self) -> Option<String> {
        if !self.mounted {
            return Some(format!(
                "the far copy's file system would not mount: {}",
                proc::tail(&self.fsck_output, 600)
            ));
        }
        if !self.bad_files.is_empty() {
            return Some(format!(
                "{} of {} files hold what the writer never wrote: {}",
                self.bad_files.len(),
                self.files,
                self.bad_files
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        if self.fsck_exit != Some(0) {
            let first = self
                .fsck_output
                .lines()
                .find(|l| !l.is_empty() && !l.starts_with("Pass ") && !l.starts_with("e2fsck"))
                .unwrap_or("");
            return Some(format!(
                "e2fsck -fn exit {}: {first}",
                self.fsck_exit.map_or("-".into(), |c| c.to_string())
            ));
        }
        None
    }
}

/// The far copy attached on `stack` checked as a failover would use it: mounted and
/// unmounted (journal replayed), its files read back, then `e2fsck -fn`.
pub fn check(stack: &mut Stack, corrupt: bool) -> Result<FsCheck> {
    let mut c = FsCheck::default();
    let t = Instant::now();
    if let Err(e) = stack.mount() {
        c.fsck_output = format!("{e:#}");
        return Ok(c);
    }
    c.mounted = true;
    c.replay_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let (files, bad) = verify_tree(stack.mnt())?;
    c.files = files;
    c.bad_files = bad;
    c.files_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    stack.umount()?;
    c.replay_s += t.elapsed().as_secs_f64();
    if corrupt {
        // lost+found's inode cleared: the directory entry then names an unused inode,
        // which e2fsck reports (the run must count it).
        sh("debugfs", &["-w", "-R", "clri <11>", stack.dev()])?;
        c.corrupted = true;
    }
    let t = Instant::now();
    let out = Command::new("e2fsck")
        .args(["-f", "-n", stack.dev()])
        .output()
        .context("running e2fsck")?;
    c.fsck_s = t.elapsed().as_secs_f64();
    c.fsck_exit = out.status.code();
    if c.fsck_exit != Some(0) {
        c.fsck_output = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c.fsck_output = proc::tail(&c.fsck_output, 4000).to_owned();
    }
    Ok(c)
}

// ---------------------------------------------------------------------------------------
// The files' content (pure): every block tagged with its file, generation and index.

/// The bytes of block `i` of generation `gen` of slot `slot`, a file of `len` bytes
/// (the last block cut to the length).
pub fn block(slot: u64, gen: u64, i: u64, len: u64) -> Vec<u8> {
    let start = i * BLOCK as u64;
    let n = (len.saturating_sub(start)).min(BLOCK as u64) as usize;
    let mut b = vec![0u8; BLOCK];
    b[..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&slot.to_le_bytes());
    b[12..20].copy_from_slice(&gen.to_le_bytes());
    b[20..28].copy_from_slice(&i.to_le_bytes());
    b[28..36].copy_from_slice(&len.to_le_bytes());
    // The rest from a small generator seeded by the tag, so a block of one file or
    // generation cannot pass for another's.
    let mut x = slot
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(gen.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add(i)
        | 1;
    for chunk in b[36..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = x.to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    b.truncate(n);
    b
}

/// A whole file's content.
pub fn content(slot: u64, gen: u64, len: u64) -> Vec<u8> {
    let blocks = len.div_ceil(BLOCK as u64);
    let mut v = Vec::with_capacity(len as usize);
    for i in 0..blocks {
        v.extend_from_slice(&block(slot, gen, i, len));
    }
    v
}

/// Whether `data` (a file of slot `slot` as read back) is the writer's: empty, or a
/// prefix of one generation's content in whole blocks (writeback may have made only part
/// of it durable), blocks never written reading as zeros. Why not, otherwise.
pub fn judge_file(slot: u64, data: &[u8]) -> Result<(), String> {
    if data.is_empty() {
        return Ok(());
    }
    let tag = |b: &[u8]| -> Option<(u64, u64, u64, u64)> {
        if b.len() < 36 || &b[..4] != MAGIC {
            return None;
        }
        let w = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        Some((w(4), w(12), w(20), w(28)))
    };
    let mut which: Option<(u64, u64)> = None;
    for (i, b) in data.chunks(BLOCK).enumerate() {
        if b.iter().all(|&x| x == 0) {
            continue;
        }
        if b.len() < 36 {
            // A last block shorter than its tag (the file's length is just past a block):
            // it is the head of the tag of the generation the blocks before it showed.
            if let Some((gen, len)) = which {
                if b != &block(slot, gen, i as u64, len)[..b.len().min(BLOCK)] {
                    return Err(format!(
                        "its last {} bytes are not generation {gen}'s",
                        b.len()
                    ));
                }
            }
            continue;
        }
        let Some((s, gen, idx, len)) = tag(b) else {
            return Err(format!(
                "block {i} of {} is not the writer's ({})",
                data.len().div_ceil(BLOCK),
                describe(b)
            ));
        };
        if s != slot || idx != i as u64 {
            return Err(format!(
                "block {i} belongs to slot {s}'s block {idx} (generation {gen})"
            ));
        }
        if let Some((g, l)) = which {
            if (g, l) != (gen, len) {
                return Err(format!(
                    "block {i} is of generation {gen}, block before of {g}"
                ));
            }
        }
        which = Some((gen, len));
        if data.len() as u64 > len {
            return Err(format!("{} bytes, longer than its {len}", data.len()));
        }
        let want = block(slot, gen, i as u64, len);
        // The last block read may be shorter than the generation's (a prefix).
        if b != &want[..b.len().min(want.len())] || b.len() > want.len() {
            return Err(format!("block {i} of generation {gen} differs"));
        }
    }
    Ok(())
}

/// What a block that is not the writer's holds, for the report: which of its 512-byte
/// sectors are zeros, which carry the writer's tag at their head, and its first bytes.
fn describe(b: &[u8]) -> String {
    let sectors: String = b
        .chunks(512)
        .map(|s| {
            if s.iter().all(|&x| x == 0) {
                '0'
            } else if s.len() >= 4 && &s[..4] == MAGIC {
                'T'
            } else {
                'x'
            }
        })
        .collect();
    let head: String = b.iter().take(32).map(|x| format!("{x:02x}")).collect();
    format!("sectors {sectors} (0 zeros, T a tag, x other), first bytes {head}")
}

/// The slot a file name holds (`fN` or `.fN.tmp`).
fn slot_of(name: &str) -> Option<u64> {
    name.strip_prefix(".f")
        .and_then(|n| n.strip_suffix(".tmp"))
        .or_else(|| name.strip_prefix('f'))
        .and_then(|n| n.parse().ok())
}

/// Every file of the writer's under `root` judged: the count, and the bad ones with why.
fn verify_tree(root: &Path) -> Result<(u64, Vec<String>)> {
    let mut files = 0;
    let mut bad = Vec::new();
    for d in 0..DIRS {
        let dir = root.join(format!("d{d}"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(slot) = slot_of(&name) else {
                bad.push(format!("d{d}/{name}: not a name the writer uses"));
                continue;
            };
            files += 1;
            match std::fs::read(e.path()) {
                Ok(data) => {
                    if let Err(why) = judge_file(slot, &data) {
                        bad.push(format!("d{d}/{name}: {why}"));
                    }
                }
                Err(err) => bad.push(format!("d{d}/{name}: read: {err}")),
            }
        }
    }
    Ok((files, bad))
}

// ---------------------------------------------------------------------------------------
// The writer: `rsv-lab dr-fs-writer` (hidden), run against the mounted file system.

/// `rsv-lab dr-fs-writer`: DR's file-system application.
#[derive(clap::Args, Debug)]
pub struct FsWriterArgs {
    /// The mounted file system.
    pub dir: PathBuf,
    /// The first operation's number (each file's generation is the number that wrote it).
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Files it keeps rewriting.
    #[arg(long)]
    pub files: u64,
    /// The largest file, bytes (each file is 4 KiB to this, by a generator from its number).
    #[arg(long, value_parser = units::parse_size)]
    pub max_file: u64,
    /// Bytes per second of file content to write at.
    #[arg(long)]
    pub rate: f64,
}

/// Bytes of the file operation `n` writes: 4 KiB to `max_file`, from `n`.
pub fn op_len(n: u64, max_file: u64) -> u64 {
    let max = max_file.max(BLOCK as u64);
    BLOCK as u64 + (n.wrapping_mul(0x9E37_79B9) >> 7) % (max - BLOCK as u64 + 1)
}

/// Replaces files one after another, paced to `rate`, and prints `n ACK_UNIX LATENCY_US`
/// per operation done (the write, the fsync when there is one, the rename): op n writes
/// file n x 7919 mod files with generation n, fsyncs it before the rename when n is even,
/// fsyncs its directory when n is a multiple of 8, and unlinks another file when n is a
/// multiple of 29.
pub fn fs_writer(a: FsWriterArgs) -> Result<()> {
    anyhow::ensure!(a.files > 0 && a.rate > 0.0, "--files and --rate above zero");
    anyhow::ensure!(a.max_file >= BLOCK as u64, "--max-file: at least 4KiB");
    for d in 0..DIRS {
        std::fs::create_dir_all(a.dir.join(format!("d{d}")))?;
    }
    let mut out = std::io::stdout().lock();
    let mut due = Instant::now();
    let mut n = a.from;
    loop {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_secs(1) {
            due = now;
        }
        let slot = (n.wrapping_mul(7919)) % a.files;
        let len = op_len(n, a.max_file);
        let dir = a.dir.join(format!("d{}", slot % DIRS));
        let tmp = dir.join(format!(".f{slot}.tmp"));
        let t = Instant::now();
        {
            let mut f = std::fs::File::create(&tmp).with_context(|| format!("op {n}"))?;
            f.write_all(&content(slot, n, len))
                .with_context(|| format!("op {n}"))?;
            if n.is_multiple_of(2) {
                f.sync_all().with_context(|| format!("op {n}: fsync"))?;
            }
        }
        std::fs::rename(&tmp, dir.join(format!("f{slot}"))).with_context(|| format!("op {n}"))?;
        if n.is_multiple_of(8) {
            std::fs::File::open(&dir)?
                .sync_all()
                .with_context(|| format!("op {n}: directory fsync"))?;
        }
        if n.is_multiple_of(29) {
            let other = (slot + a.files / 2) % a.files;
            let _ = std::fs::remove_file(a.dir.join(format!("d{}/f{other}", other % DIRS)));
        }
        writeln!(out, "{n} {:.6} {}", unix_now(), t.elapsed().as_micros())?;
        n += 1;
        due += Duration::from_secs_f64(len as f64 / a.rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_content_and_its_prefixes_are_the_writers() {
        let c = content(3, 17, 3 * BLOCK as u64 + 100);
        assert_eq!(c.len(), 3 * BLOCK + 100);
        assert_eq!(judge_file(3, &c), Ok(()));
        assert_eq!(judge_file(3, &[]), Ok(()));
        // Writeback made the first two blocks durable, not the rest.
        assert_eq!(judge_file(3, &c[..2 * BLOCK]), Ok(()));
        // A block never written reads as zeros.
        let mut z = c.clone();
        z[BLOCK..2 * BLOCK].fill(0);
        assert_eq!(judge_file(3, &z), Ok(()));
    }

    #[test]
    fn another_files_or_generations_block_is_not() {
        let c = content(3, 17, 3 * BLOCK as u64);
        assert!(judge_file(4, &c).is_err());
        let mut mixed = c.clone();
        mixed[BLOCK..2 * BLOCK]
            .copy_from_slice(&content(3, 18, 3 * BLOCK as u64)[BLOCK..2 * BLOCK]);
        assert!(judge_file(3, &mixed).is_err());
        let mut flipped = c.clone();
        flipped[BLOCK + 500] ^= 1;
        assert!(judge_file(3, &flipped).is_err());
        let mut garbage = c.clone();
        garbage[..BLOCK].fill(0xAB);
        assert!(judge_file(3, &garbage).is_err());
        // A length just past a block: the last block is shorter than its own tag.
        let short = content(3, 17, 2 * BLOCK as u64 + 31);
        assert_eq!(judge_file(3, &short), Ok(()));
        let mut bad_tail = short.clone();
        bad_tail[2 * BLOCK + 5] ^= 1;
        assert!(judge_file(3, &bad_tail).is_err());
        // Longer than the generation's own length.
        let mut long = c.clone();
        long.extend_from_slice(&[1; 10]);
        assert!(judge_file(3, &long).is_err());
        assert_eq!(slot_of(".f12.tmp"), Some(12));
        assert_eq!(slot_of("f7"), Some(7));
        assert_eq!(slot_of("lost+found"), None);
    }
}
