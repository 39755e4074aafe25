//! `rsv mount URL FILE`: a LUN as one regular file through FUSE, so that `losetup`,
//! `mkfs.ext4` and `mount` put a file system on a remote LUN without a kernel initiator.
//!
//! The FUSE loop only decodes requests; each read or write becomes a task on a tokio
//! runtime that answers the kernel when its SCSI command completes, so the session's
//! queue depth is what bounds the I/O in flight, not the number of FUSE threads. The file
//! is opened in direct-I/O mode: the kernel passes every request through at its own size
//! and the page cache holds no second copy behind the loop device's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, FopenFlags, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};

use crate::cli::SessionFlags;
use initiator::Lun;

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// iscsi://[user[%password]@]host[:port]/TARGET-IQN/LUN, or
    /// isns://SERVER[:PORT]/ALIAS-or-IQN/LUN (the target's portal from an iSNS server)
    pub url: String,
    /// A regular file to mount the LUN on (created if missing). Unmount with
    /// `fusermount3 -u FILE`, SIGINT or SIGTERM.
    pub file: PathBuf,
    #[command(flatten)]
    pub session: SessionFlags,
    /// Refuse writes.
    #[arg(long)]
    pub read_only: bool,
    /// Let users other than the one who mounted open the file (FUSE allow_other).
    #[arg(long)]
    pub allow_other: bool,
}

/// The largest request the kernel is asked to send: one SCSI command per request.
const MAX_IO: u32 = 1 << 20;
const TTL: Duration = Duration::from_secs(1);

struct LunFile {
    lun: Lun,
    size: u64,
    read_only: bool,
    rt: tokio::runtime::Handle,
    attr: FileAttr,
}

fn eio(e: impl std::fmt::Display) -> Errno {
    tracing::warn!("I/O on the LUN failed: {e}");
    Errno::EIO
}

impl fuser::Filesystem for LunFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        // Direct I/O from the loop device may then be asynchronous: several requests of
        // one submitter in flight at once.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        reply.attr(&TTL, &self.attr);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        // The file is the LUN: its size is the LUN's. Other attributes are not kept.
        if size.is_some_and(|s| s != self.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &self.attr);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.read_only && flags.acc_mode() != fuser::OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        let lun = self.lun.clone();
        self.rt.spawn(async move {
            match lun.read_at(offset, len).await {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(eio(e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        if offset + data.len() as u64 > self.size {
            return reply.error(Errno::ENOSPC);
        }
        let data = Bytes::copy_from_slice(data);
        let lun = self.lun.clone();
        self.rt.spawn(async move {
            let n = data.len() as u32;
            match lun.write_at(offset, data).await {
                Ok(()) => reply.written(n),
                Err(e) => reply.error(eio(e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.sync(reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(reply);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &std::ffi::OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // ENOSYS tells the kernel to stop asking (it checks security.capability on every
        // write otherwise).
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }
}

impl LunFile {
    /// SYNCHRONIZE CACHE: what the target acknowledged is on its stable storage.
    fn sync(&self, reply: ReplyEmpty) {
        if self.read_only {
            return reply.ok();
        }
        let lun = self.lun.clone();
        self.rt.spawn(async move {
            match lun.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(eio(e)),
            }
        });
    }
}

fn file_attr(size: u64, block: u32, read_only: bool) -> FileAttr {
    let now = SystemTime::now();
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    FileAttr {
        ino: INodeNo::ROOT,
        size,
        blocks: size.div_ceil(512),
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind: FileType::RegularFile,
        perm: if read_only { 0o444 } else { 0o644 },
        nlink: 1,
        uid,
        gid,
        rdev: 0,
        blksize: block.max(4096),
        flags: 0,
    }
}

/// Unmounts a [`Mounted`] from any thread.
#[derive(Clone)]
pub struct Unmounter(Arc<Mutex<fuser::SessionUnmounter>>);

impl Unmounter {
    /// Fails with EBUSY while a loop device or an open file holds the mount.
    pub fn unmount(&self) -> std::io::Result<()> {
        self.0.lock().unwrap().unmount()
    }
}

/// A mounted LUN. Dropping it does not unmount; call [`Mounted::wait`].
pub struct Mounted {
    fuse: std::thread::JoinHandle<std::io::Result<()>>,
    unmounter: Unmounter,
    lun: Lun,
    pub file: PathBuf,
    pub size: u64,
}

impl Mounted {
    /// Mounts the LUN of `url` on `file` (created if missing); the FUSE loop runs on a
    /// thread of its own and the I/O on the current tokio runtime.
    pub async fn start(args: &MountArgs) -> anyhow::Result<Mounted> {
        let url = crate::cli::target_url(&args.url, &args.session).await?;
        url.lun_required()?;
        let opts = args.session.options(&url)?;
        if !args.file.exists() {
            std::fs::File::create(&args.file).with_context(|| {
                format!("cannot create the mount point {}", args.file.display())
            })?;
        }
        if !std::fs::metadata(&args.file)?.is_file() {
            anyhow::bail!("{} is not a regular file", args.file.display());
        }
        let lun = Lun::open_url(&url, &opts).await?;
        let size = lun.size();
        let fs = LunFile {
            lun: lun.clone(),
            size,
            read_only: args.read_only,
            rt: tokio::runtime::Handle::current(),
            attr: file_attr(size, lun.block_size(), args.read_only),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(format!("rsv:{}", url.target_required()?)),
            MountOption::Subtype("rsv".into()),
            if args.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
            MountOption::NoExec,
            MountOption::NoSuid,
            MountOption::NoDev,
        ];
        if args.allow_other {
            config.acl = fuser::SessionACL::All;
        }
        let file = args.file.clone();
        let mounted =
            tokio::task::spawn_blocking(move || fuser::Session::new(fs, &file, &config)).await?;
        let mut fuse = match mounted {
            Ok(f) => f,
            Err(e) => {
                let _ = lun.session().logout().await;
                return Err(e).with_context(|| {
                    format!(
                        "cannot mount on {} (FUSE needs /dev/fuse and fusermount3)",
                        args.file.display()
                    )
                });
            }
        };
        let unmounter = Unmounter(Arc::new(Mutex::new(fuse.unmount_callable())));
        let fuse = std::thread::Builder::new()
            .name("fuse".into())
            .spawn(move || fuse.run())?;
        Ok(Mounted {
            fuse,
            unmounter,
            lun,
            file: args.file.clone(),
            size,
        })
    }

    pub fn unmounter(&self) -> Unmounter {
        self.unmounter.clone()
    }

    /// Waits for the file system to be unmounted (by [`Mounted::unmount`], `fusermount3
    /// -u` or `umount`), then flushes the target's cache and logs out.
    pub async fn wait(self) -> anyhow::Result<()> {
        let fuse = self.fuse;
        let ran = tokio::task::spawn_blocking(move || fuse.join()).await?;
        let synced = self.lun.flush().await;
        let _ = self.lun.session().logout().await;
        match ran {
            Ok(r) => r.context("FUSE session")?,
            Err(_) => anyhow::bail!("the FUSE thread panicked"),
        }
        synced.context("SYNCHRONIZE CACHE after unmount")?;
        Ok(())
    }
}

/// `rsv mount`: serves until unmounted; SIGINT and SIGTERM unmount.
pub fn mount(args: MountArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let m = Mounted::start(&args).await?;
        eprintln!(
            "mounted {} ({} bytes) on {}",
            crate::cli::redact(&args.url),
            m.size,
            m.file.display()
        );
        let file = m.file.clone();
        let unmounter = m.unmounter();
        let signals = tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                match unmounter.unmount() {
                    Ok(()) => return Ok::<_, std::io::Error>(()),
                    Err(e) => eprintln!(
                        "cannot unmount {}: {e}; detach the loop device (losetup -d) or close \
                         the file, then signal again",
                        file.display()
                    ),
                }
            }
        });
        let r = m.wait().await;
        signals.abort();
        r
    })
}
