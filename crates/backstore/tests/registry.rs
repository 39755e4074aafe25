//! Opening stores from specs through the registry: the built-in kinds, the errors a person
//! fixing a configuration sees, and a kind registered from outside the crate that is built
//! on members opened through the same registry.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use backstore::{
    Backstore, FileBackstore, Lent, OpenContext, OpenError, Param, Registry, StoreFactory,
    StoreSpec,
};

const MIB: u64 = 1 << 20;

fn spec(s: &str) -> StoreSpec {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn builtin_kinds_open_from_specs() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::with_builtins();
    assert_eq!(
        reg.kinds().collect::<Vec<_>>(),
        ["file", "null", "ram", "stripe"]
    );
    let ctx = reg.context(dir.path());

    let file = spec("file:sub/lun0.img?size=4M");
    let desc = ctx.check(&file).unwrap();
    assert!(
        desc.contains("created sparse") && desc.contains("4MiB"),
        "{desc}"
    );
    assert!(!dir.path().join("sub").exists(), "check created something");
    let store = ctx.open(&file).unwrap();
    let path = dir.path().join("sub/lun0.img");
    assert_eq!(store.size(), 4 * MIB);
    assert!(store.can_lend(), "the file store must still lend");
    assert_eq!(
        store.sidecar(".pr"),
        Some(PathBuf::from(format!("{}.pr", path.display())))
    );
    assert!(store.description().contains(&path.display().to_string()));
    let data = pattern(3, 4096);
    store.write_at(&data, MIB).unwrap();
    drop(store);
    let mut back = vec![0; 4096];
    FileBackstore::open(&path, None, false, true)
        .unwrap()
        .read_at(&mut back, MIB)
        .unwrap();
    assert_eq!(back, data);
    // Existing now: described as it is, reopened at its size, absolute paths as given.
    let desc = ctx.check(&spec("file:sub/lun0.img")).unwrap();
    assert!(desc.ends_with("4MiB"), "{desc}");
    let abs = spec(&format!("file:{}", path.display()));
    assert_eq!(
        reg.context(std::path::Path::new("/nonexistent"))
            .open(&abs)
            .unwrap()
            .size(),
        4 * MIB
    );
    let ro = ctx.read_only(true).open(&abs).unwrap();
    assert!(ro.read_only() && ro.write_at(&data, 0).is_err());

    let ram = ctx.open(&spec("ram:?size=2M")).unwrap();
    assert_eq!(ram.size(), 2 * MIB);
    assert_eq!(ram.sidecar(".pr"), None);
    assert!(ram.can_lend() && ram.lends_memory());
    ram.write_at(&data, 8192).unwrap();
    ram.read_at(&mut back, 8192).unwrap();
    assert_eq!(back, data);
    assert!(ctx.check(&spec("ram:?size=2M")).unwrap().contains("2MiB"));

    let help = reg.help();
    assert!(
        help.contains("file:") && help.contains("path (required)") && help.contains("ram:"),
        "{help}"
    );
}

/// `null:?size=SIZE`: the size it was given, zeros whatever was written, writes beyond
/// the end refused as any store's, nothing allocated, zeros lent without a copy.
#[test]
fn null_store_reads_zeros_and_drops_writes() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::with_builtins();
    let ctx = reg.context(dir.path());
    let null = spec("null:?size=64M");
    let desc = ctx.check(&null).unwrap();
    assert!(desc.contains("null") && desc.contains("64MiB"), "{desc}");
    assert_eq!(ctx.capacity(&null), Ok(64 * MIB));
    let store = ctx.open(&null).unwrap();
    assert_eq!(store.size(), 64 * MIB);
    assert_eq!(store.sidecar(".pr"), None);
    assert!(!store.read_only());
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "it made a file"
    );

    store.write_at(&pattern(7, 8192), MIB).unwrap();
    store.flush().unwrap();
    let mut back = vec![0xa5; 8192];
    store.read_at(&mut back, MIB).unwrap();
    assert!(back.iter().all(|&b| b == 0), "a write was kept");
    assert!(store.try_read_at(&mut back, 0).unwrap());
    // Beyond the end: refused, as by every store.
    assert!(store.write_at(&back, 64 * MIB - 4096).is_err());
    assert!(store.read_at(&mut back, 64 * MIB - 4096).is_err());
    assert!(store.discard(64 * MIB, 1).is_err());
    store.discard(0, MIB).unwrap();
    store.write_zeroes(0, 64 * MIB).unwrap();
    assert_eq!(
        store.is_allocated(4096, 2 * MIB).unwrap(),
        [(4096, 2 * MIB, false)]
    );
    // Reads up to 1 MiB are lent zeros; larger ones copied.
    assert!(store.can_lend() && store.lends_memory());
    let w = store.lend(MIB, MIB, false).unwrap().unwrap();
    assert_eq!(w.len(), MIB as usize);
    assert!(w.as_ref().iter().all(|&b| b == 0));
    assert!(store.lend(0, 2 * MIB, false).unwrap().is_none());
    assert!(store.lend(64 * MIB - 512, 1024, false).is_err());

    // The size is required and read as every size is.
    assert!(ctx
        .open(&spec("null:"))
        .unwrap_err()
        .to_string()
        .contains("needs \"size\""));
    assert!(ctx.check(&spec("null:?size=lots")).is_err());
    assert!(
        ctx.open(&spec("null:x?size=1M")).is_err(),
        "null takes no path"
    );
}

#[test]
fn open_errors_say_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::with_builtins();
    let ctx = reg.context(dir.path());
    let err = |s: &str| -> String {
        let check = ctx.check(&spec(s)).err().map(|e| e.to_string());
        let open = ctx.open(&spec(s)).err().map(|e| e.to_string());
        assert!(
            check.is_some() && open.is_some(),
            "{s}: check {check:?}, open {open:?}"
        );
        open.unwrap()
    };
    let e = err("disk:x.img");
    assert!(
        e.contains("\"disk\"") && e.contains("known kinds: file, null, ram"),
        "{e}"
    );
    let e = err("file:x.img?size=1G&sise=2G");
    assert!(
        e.contains("\"sise\"") && e.contains("it takes path, size"),
        "{e}"
    );
    let e = err("ram:");
    assert!(e.contains("ram:") && e.contains("needs \"size\""), "{e}");
    let e = err("file:?size=1M");
    assert!(e.contains("needs \"path\""), "{e}");
    let e = err("file:x.img?size=1M&members=[ram:?size=1M]");
    assert!(e.contains("\"members\""), "{e}");
    let e = err("ram:?size=lots");
    assert!(e.contains("size=\"lots\""), "{e}");
    let e = err("file:missing.img");
    assert!(e.contains("missing.img") && e.contains("no size"), "{e}");
    std::fs::write(dir.path().join("big.img"), vec![0u8; 8192]).unwrap();
    let e = err("file:big.img?size=4096");
    assert!(e.contains("big.img") && e.contains("truncat"), "{e}");
    let e = ctx
        .read_only(true)
        .check(&spec("file:new.img?size=1M"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("read-only"), "{e}");
}

/// `window:?offset=SIZE&len=SIZE&members=[SPEC]`: a range of one member store, the test's
/// own kind. Small, but real: every byte it moves goes to its member at a shifted offset.
struct WindowFactory;

#[derive(Debug)]
struct Window {
    member: Arc<dyn Backstore>,
    offset: u64,
    len: u64,
}

impl Window {
    fn at(&self, offset: u64, len: u64) -> io::Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "beyond the window",
            )),
        }
    }
}

impl Backstore for Window {
    fn size(&self) -> u64 {
        self.len
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.member.read_at(buf, self.at(offset, buf.len() as u64)?)
    }
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        self.member
            .try_read_at(buf, self.at(offset, buf.len() as u64)?)
    }
    fn lend(&self, offset: u64, len: u64, wait: bool) -> io::Result<Option<Lent>> {
        self.member.lend(self.at(offset, len)?, len, wait)
    }
    fn can_lend(&self) -> bool {
        self.member.can_lend()
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.member
            .write_at(buf, self.at(offset, buf.len() as u64)?)
    }
    fn flush(&self) -> io::Result<()> {
        self.member.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.member.discard(self.at(offset, len)?, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.member.write_zeroes(self.at(offset, len)?, len)
    }
    fn is_allocated(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u64, bool)>> {
        let at = self.at(offset, len)?;
        Ok(self
            .member
            .is_allocated(at, len)?
            .into_iter()
            .map(|(o, l, a)| (o - self.offset, l, a))
            .collect())
    }
    fn supports_discard(&self) -> bool {
        self.member.supports_discard()
    }
    fn read_only(&self) -> bool {
        self.member.read_only()
    }
    fn description(&self) -> String {
        format!("window at {} of {}", self.offset, self.member.description())
    }
    fn sidecar(&self, suffix: &str) -> Option<PathBuf> {
        self.member.sidecar(&format!(".window{suffix}"))
    }
}

impl WindowFactory {
    fn parts(spec: &StoreSpec) -> Result<(u64, Option<u64>, &StoreSpec), OpenError> {
        let [member] = spec.members() else {
            return Err(OpenError::invalid(spec, "a window has exactly one member"));
        };
        let offset = spec.size("offset")?.ok_or_else(|| spec.missing("offset"))?;
        Ok((offset, spec.size("len")?, member))
    }
}

impl StoreFactory for WindowFactory {
    fn kind(&self) -> &str {
        "window"
    }
    fn summary(&self) -> &str {
        "a range of another store"
    }
    fn params(&self) -> &[Param] {
        &[
            Param {
                name: "offset",
                required: true,
                help: "where the range starts",
            },
            Param {
                name: "len",
                required: false,
                help: "its length; absent: to the end",
            },
            Param {
                name: "members",
                required: true,
                help: "the one store it is a range of",
            },
        ]
    }
    fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let (offset, _, member) = Self::parts(spec)?;
        Ok(format!("window at {offset} of {}", ctx.check(member)?))
    }
    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        let (offset, len, member) = Self::parts(spec)?;
        let member = ctx.open(member)?;
        let len = len.unwrap_or(member.size().saturating_sub(offset));
        if !matches!(offset.checked_add(len), Some(end) if end <= member.size()) {
            return Err(OpenError::invalid(
                spec,
                format!(
                    "offset {offset} + len {len} is beyond the member's {} bytes",
                    member.size()
                ),
            ));
        }
        Ok(Arc::new(Window {
            member,
            offset,
            len,
        }))
    }
}

#[test]
fn a_kind_registered_from_outside_opens_its_members_through_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let mut reg = Registry::with_builtins();
    assert!(reg.register(WindowFactory).is_none());
    let ctx = reg.context(dir.path());

    // Two levels: a window on a window on a file, from text and from a TOML table alike.
    let text = spec(
        "window:?offset=1M&members=[window:?offset=512K&len=2M&members=[file:lun.img?size=4M]]",
    );
    let table: StoreSpec = toml::from_str(
        r#"
kind = "window"
offset = "1M"
[[members]]
kind = "window"
offset = "512K"
len = "2M"
members = ["file:lun.img?size=4M"]
"#,
    )
    .unwrap();
    assert_eq!(table, text);
    let desc = ctx.check(&text).unwrap();
    assert!(
        desc.starts_with("window at 1048576 of window at 524288 of file "),
        "{desc}"
    );

    let outer = ctx.open(&text).unwrap();
    assert_eq!(outer.size(), MIB);
    let data = pattern(7, 64 * 1024);
    outer.write_at(&data, 4096).unwrap();
    assert!(
        outer.write_at(&data, MIB - 4096).is_err(),
        "a write past the window went through"
    );
    drop(outer);

    // The bytes landed in the file, 1.5 MiB further on.
    let file = FileBackstore::open(dir.path().join("lun.img"), None, false, true).unwrap();
    let mut back = vec![0; data.len()];
    file.read_at(&mut back, MIB + 512 * 1024 + 4096).unwrap();
    assert_eq!(back, data);

    // Reopened read-only, the window reads them back, lends them from the file, and keeps
    // its sidecar beside the file's image.
    let outer = ctx.read_only(true).open(&text).unwrap();
    assert!(outer.read_only());
    let mut again = vec![0; data.len()];
    outer.read_at(&mut again, 4096).unwrap();
    assert_eq!(again, data);
    assert!(outer.can_lend());
    let lent = outer
        .lend(4096, data.len() as u64, true)
        .unwrap()
        .expect("lent through the windows");
    assert_eq!(lent.as_ref(), &data[..]);
    assert_eq!(
        outer.sidecar(".pr"),
        Some(PathBuf::from(format!(
            "{}.window.window.pr",
            dir.path().join("lun.img").display()
        )))
    );

    // A member's errors come back naming the member; the window's own name the window.
    let e = ctx
        .open(&spec("window:?offset=0&members=[tape:x]"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"tape\"") && e.contains("known kinds: file, null, ram, stripe, window"),
        "{e}"
    );
    let e = ctx
        .open(&spec("window:?offset=8M&members=[ram:?size=4M]"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("store `window:?offset=8M&members=[ram:?size=4M]`: ") && e.contains("beyond"),
        "{e}"
    );
    let e = ctx.open(&spec("window:?offset=0")).unwrap_err().to_string();
    assert!(e.contains("needs \"members\""), "{e}");
}
