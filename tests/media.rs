//! `rsv media` with real clients: an ext4 image made by `mkfs.ext4 -d` holding a clip made
//! by `ffmpeg`'s test sources, served by `rsv target`, registered in `rsv isns`, found by
//! `rsv media`; `curl` with ranges (206, 416, HEAD), `ffprobe` reading the clip over HTTP,
//! headless Chromium playing it in the player page (its `currentTime` read through the
//! DevTools protocol advances; a screenshot goes to the test's output directory); the
//! session logged out when idle and back in on the next request; the target stopped
//! mid-stream (the stream ends, the listing drops it) and started again (back in the
//! listing).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::exposition::{promtool_check, series};
use testkit::ready::{spawn_ready, spawn_until_ready};
use testkit::{have, rsv};

const IQN: &str = "iqn.2026-11.org.reservoir:med-home";

fn ok(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn sigterm(c: &mut Child) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(30);
    while c.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Kids(Vec<Child>);
impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-s", "--max-time", "30"])
        .args(args)
        .output()
        .unwrap()
}

fn listing(media: &str) -> serde_json::Value {
    let o = curl(&[&format!("http://{media}/api/media")]);
    assert!(o.status.success(), "curl /api/media: {o:?}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&o.stdout));
    })
}

fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `rsv isns` on a port the kernel chose, its log in `dir`, kept in `kids`: its address and
/// its port.
fn start_isns(dir: &Path, kids: &mut Kids) -> (String, String) {
    let (isns, addr) = spawn_ready(
        Command::new(rsv()).args(["isns", "--listen", "127.0.0.1:0", "--period", "30"]),
        &dir.join("isns.log"),
    );
    kids.0.push(isns);
    let port = addr.rsplit_once(':').unwrap().1.to_owned();
    (addr, port)
}

/// `rsv media` finding storage through the iSNS server at `isns`, listening on a port the
/// kernel chose, polling iSNS only every 600 s (longer than a test: storage that leaves or
/// comes back is seen through the SCNs `rsv isns` sends, not the poll), with `flags`; its
/// log in `dir`, kept in `kids`: its address.
fn start_media(dir: &Path, isns: &str, flags: &[&str], kids: &mut Kids) -> String {
    let (media, addr) = spawn_ready(
        Command::new(rsv())
            .args(["media", "--isns", isns, "--listen", "127.0.0.1:0"])
            .args(["--poll", "600s"])
            .args(flags),
        &dir.join("media.log"),
    );
    kids.0.push(media);
    addr
}

/// `len` bytes of a pattern that does not repeat within a block: media larger than what
/// the loopback's socket buffers hold.
fn patterned(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// A 64 MiB ext4 image `img` holding the files of `src` (`mkfs.ext4 -d`), with `mkfs`'s
/// `flags`.
fn ext4_image(img: &Path, src: &Path, flags: &[&str]) {
    ok(Command::new("truncate").args(["-s", "64M"]).arg(img));
    ok(Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(flags)
        .arg("-d")
        .arg(src)
        .arg(img));
}

fn target_config(dir: &Path, isns_port: &str, portal: &str) -> PathBuf {
    let p = dir.join("target.toml");
    std::fs::write(
        &p,
        format!(
            "portals = [\"{portal}\"]\ndata_dir = \"{d}\"\n[[target]]\niqn = \"{IQN}\"\n\
             alias = \"home\"\n[[target.lun]]\nid = 0\nstore = \"file:{d}/disk.img\"\n\
             [isns]\nserver = \"127.0.0.1:{isns_port}\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    p
}

#[test]
fn media_server_streams_to_curl_ffprobe_and_chromium() {
    for t in ["ffmpeg", "ffprobe", "mkfs.ext4", "curl", "chromium"] {
        if !have(t) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src/videos");
    std::fs::create_dir_all(&src).unwrap();
    // A 3-second clip from test sources (VP8 and Opus in WebM: Chromium plays it as
    // Debian builds it), a 24 MiB file for the interrupted stream, and a file that is not
    // media (not listed).
    ok(Command::new("ffmpeg")
        .args([
            "-loglevel",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "testsrc=duration=3:size=320x240:rate=25",
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:duration=3",
            "-c:v",
            "libvpx",
            "-b:v",
            "300k",
            "-c:a",
            "libopus",
            "-shortest",
        ])
        .arg(src.join("clip.webm")));
    let big = patterned(24 << 20);
    std::fs::write(src.join("big.mp4"), &big).unwrap();
    std::fs::write(d.join("src/notes.txt"), "not media\n").unwrap();
    ext4_image(&d.join("disk.img"), &d.join("src"), &["-L", "media"]);
    let clip = std::fs::read(src.join("clip.webm")).unwrap();

    let mut kids = Kids(Vec::new());
    let (isns_addr, isns_port) = start_isns(d, &mut kids);
    let cfg = target_config(d, &isns_port, "127.0.0.1:0");
    let (target, portal) = spawn_ready(
        Command::new(rsv()).arg("target").arg("-c").arg(&cfg),
        &d.join("target.log"),
    );
    kids.0.push(target);
    let media = start_media(
        d,
        &isns_addr,
        &["--idle", "2s", "--recovery-timeout", "3s"],
        &mut kids,
    );
    let media_log = || std::fs::read_to_string(d.join("media.log")).unwrap_or_default();

    // The listing: found through iSNS, the session opened to list it.
    let l = listing(&media);
    let s = &l["storages"][0];
    assert_eq!(s["target"], IQN, "{l}");
    assert_eq!(s["id"], "home", "{l}");
    assert_eq!(s["portal"], portal.as_str(), "{l}");
    let files = &s["volumes"][0]["files"];
    assert_eq!(s["volumes"][0]["fs"], "ext4", "{l}");
    let paths: Vec<&str> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/videos/big.mp4", "/videos/clip.webm"], "{l}");
    assert_eq!(files[1]["size"], clip.len() as u64);
    assert_eq!(files[1]["content_type"], "video/webm");
    let page = curl(&[&format!("http://{media}/")]);
    let page = String::from_utf8_lossy(&page.stdout);
    assert!(
        page.contains("href=\"/play/home/0/videos/clip.webm\""),
        "{page}"
    );
    assert!(!page.contains("notes.txt"), "{page}");

    // curl: ranges, a range past the end, HEAD, the whole file.
    let url = format!("http://{media}/media/home/0/videos/clip.webm");
    let o = curl(&[
        "-D",
        "-",
        "-o",
        &d.join("part").display().to_string(),
        "-r",
        "100-1123",
        &url,
    ]);
    let head = String::from_utf8_lossy(&o.stdout);
    assert!(head.starts_with("HTTP/1.1 206"), "{head}");
    assert!(
        head.contains(&format!("Content-Range: bytes 100-1123/{}", clip.len())),
        "{head}"
    );
    assert!(head.contains("Accept-Ranges: bytes"), "{head}");
    assert!(head.contains("Content-Type: video/webm"), "{head}");
    assert_eq!(std::fs::read(d.join("part")).unwrap(), &clip[100..1124]);
    let o = curl(&["-D", "-", "-o", "/dev/null", "-r", "-500", &url]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!(
        "Content-Range: bytes {}-{}/{}",
        clip.len() - 500,
        clip.len() - 1,
        clip.len()
    )));
    let o = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-r",
        &format!("{}-", clip.len()),
        &url,
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "416");
    let o = curl(&["-I", &url]);
    let head = String::from_utf8_lossy(&o.stdout);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("Content-Length: {}", clip.len())),
        "{head}"
    );
    let o = curl(&[&url]);
    assert!(o.stdout == clip, "the whole file differs");
    let o = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{media}/media/home/0/videos/none.webm"),
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "404");

    // ffprobe reads the clip over HTTP (seeking with ranges to find its duration).
    let o = ok(Command::new("ffprobe").args([
        "-v",
        "error",
        "-show_entries",
        "format=duration:stream=codec_name",
        "-of",
        "json",
        &url,
    ]));
    let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let dur: f64 = p["format"]["duration"].as_str().unwrap().parse().unwrap();
    assert!((2.9..3.2).contains(&dur), "duration {dur}: {p}");
    let codecs: Vec<&str> = p["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["codec_name"].as_str().unwrap())
        .collect();
    assert_eq!(codecs, ["vp8", "opus"], "{p}");

    // Chromium plays it in the player page.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("media");
    std::fs::create_dir_all(&out).unwrap();
    let shot = out.join("player.png");
    let _ = std::fs::remove_file(&shot);
    let played = chromium_plays(
        &format!("http://{media}/play/home/0/videos/clip.webm"),
        &shot,
        &d.join("chromium"),
    );
    assert!(played >= 1.0, "currentTime only reached {played}");
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 1000)
            .unwrap_or(false),
        "no screenshot"
    );
    eprintln!(
        "chromium played to {played:.2} s; screenshot {}",
        shot.display()
    );

    // Idle: logged out, the listing kept; the next request logs in again.
    wait_until(20, "the idle session to close", || {
        listing(&media)["storages"][0]["state"] == "closed"
    });
    assert!(media_log().contains("logged out of"), "{}", media_log());
    let o = curl(&["-r", "0-99", &url]);
    assert_eq!(o.stdout, &clip[..100]);
    assert_eq!(listing(&media)["storages"][0]["state"], "open");

    // The target stops mid-stream: the stream ends, the listing drops the storage.
    let big_url = format!("http://{media}/media/home/0/videos/big.mp4");
    let mut stream = Command::new("curl")
        .args(["-s", "--max-time", "60", "--limit-rate", "1M", "-o"])
        .arg(d.join("big.part"))
        .arg(&big_url)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let mut target = kids.0.remove(1);
    sigterm(&mut target);
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = stream.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "the stream did not end"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let got = std::fs::read(d.join("big.part")).unwrap_or_default();
    // Whatever arrived is the file's own bytes; the stream did not complete.
    assert!(
        !st.success(),
        "curl got the whole file from a stopped target?"
    );
    assert!(
        got.len() < big.len() && got[..] == big[..got.len()],
        "{} bytes",
        got.len()
    );
    eprintln!(
        "stream ended {:?} after the target stopped, {} of {} bytes",
        t0.elapsed(),
        got.len(),
        big.len()
    );
    wait_until(20, "the storage to leave the listing", || {
        listing(&media)["storages"].as_array().unwrap().is_empty()
    });
    // Back on another port: found again, served from the new portal.
    let cfg = target_config(d, &isns_port, "127.0.0.1:0");
    let (target, portal2) = spawn_ready(
        Command::new(rsv()).arg("target").arg("-c").arg(&cfg),
        &d.join("target2.log"),
    );
    kids.0.push(target);
    wait_until(20, "the storage to come back", || {
        listing(&media)["storages"][0]["portal"] == portal2.as_str()
    });
    let o = curl(&["-r", "1000-1999", &url]);
    assert_eq!(o.stdout, &clip[1000..2000]);
}

/// Storage registering and deregistering in `rsv isns` reaches `rsv media`'s listing
/// through the SCNs it registered for, with a poll far longer than the test; the
/// lookups' own registrations wake no SCN (no loop of polls); the watcher deregisters
/// when `rsv media` stops.
#[test]
fn media_listing_follows_isns_scns() {
    if !have("curl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = "iqn.2026-11.org.reservoir:med-watch";
    let mut kids = Kids(Vec::new());
    let (isns_addr, isns_port) = start_isns(d, &mut kids);
    let media = start_media(d, &isns_addr, &["--initiator-name", me], &mut kids);
    let isns_log = || std::fs::read_to_string(d.join("isns.log")).unwrap_or_default();
    let targets = |media: &str| -> Vec<String> {
        listing(media)["storages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["target"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    wait_until(20, "the watcher's SCN registration", || {
        isns_log().contains(&format!("SCNReg from {me}-scn -> Successful"))
    });
    assert!(targets(&media).is_empty());
    let cfg = d.join("target.toml");
    std::fs::write(
        &cfg,
        format!(
            "portals = [\"127.0.0.1:0\"]\ndata_dir = \"{d}\"\n[[target]]\niqn = \"{IQN}\"\n\
             alias = \"home\"\n[[target.lun]]\nid = 0\nstore = \"ram:?size=4MiB\"\n\
             [isns]\nserver = \"127.0.0.1:{isns_port}\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    for round in 0..2 {
        let (target, _) = spawn_ready(
            Command::new(rsv()).arg("target").arg("-c").arg(&cfg),
            &d.join(format!("target{round}.log")),
        );
        kids.0.push(target);
        wait_until(20, "the storage to be listed", || targets(&media) == [IQN]);
        let mut target = kids.0.pop().unwrap();
        sigterm(&mut target);
        wait_until(20, "the storage to leave the listing", || {
            targets(&media).is_empty()
        });
    }
    // Four changes, each told to the watcher once; with the lookups' registrations
    // notified too, each poll would wake the next and this would keep growing.
    let told = |log: &str| log.matches(&format!("SCN to {me}-scn:")).count();
    std::thread::sleep(Duration::from_secs(2));
    let n = told(&isns_log());
    assert_eq!(n, 4, "{}", isns_log());
    assert!(
        !isns_log().contains(&format!("SCN to {me}:")),
        "{}",
        isns_log()
    );
    let mut media_child = kids.0.remove(1);
    sigterm(&mut media_child);
    assert!(
        isns_log().contains(&format!("DevDereg from {me}-scn -> Successful")),
        "the watcher did not deregister:\n{}",
        isns_log()
    );
}

/// Loads `url` in headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: fd 3 in, fd 4 out, messages ending in NUL), waits until the
/// page's `<video>` has played at least 1.5 s (or 30 s pass), saves a screenshot to
/// `shot` and returns the furthest `currentTime` seen.
fn chromium_plays(url: &str, shot: &Path, profile: &Path) -> f64 {
    use std::os::unix::process::CommandExt;
    let pipe = || {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) into a two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both fds are fresh and ours.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    };
    let (to_chrome_r, to_chrome_w) = pipe();
    let (from_chrome_r, from_chrome_w) = pipe();
    let (a, b) = (
        std::os::fd::AsRawFd::as_raw_fd(&to_chrome_r),
        std::os::fd::AsRawFd::as_raw_fd(&from_chrome_w),
    );
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required",
        "--remote-debugging-pipe",
        "--window-size=800,600",
        "--no-first-run",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg("about:blank")
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    // SAFETY: only async-signal-safe dup2 calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("starting chromium");
    let mut kid = Kids(vec![child]);
    drop(to_chrome_r);
    drop(from_chrome_w);
    let mut w = std::fs::File::from(to_chrome_w);
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let r = std::fs::File::from(from_chrome_r);
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut msg = Vec::new();
        while r.read_until(0, &mut msg).map(|n| n > 0).unwrap_or(false) {
            msg.pop();
            if let Ok(v) = serde_json::from_slice(&msg) {
                if tx.send(v).is_err() {
                    return;
                }
            }
            msg.clear();
        }
    });
    let mut id = 0;
    let mut call = |session: Option<&str>, method: &str, params: serde_json::Value| {
        id += 1;
        let mut m = serde_json::json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            m["sessionId"] = s.into();
        }
        let mut bytes = serde_json::to_vec(&m).unwrap();
        bytes.push(0);
        w.write_all(&bytes).unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    };
    let t = call(None, "Target.createTarget", serde_json::json!({"url": url}));
    let target = t["targetId"].as_str().unwrap().to_owned();
    let s = call(
        None,
        "Target.attachToTarget",
        serde_json::json!({"targetId": target, "flatten": true}),
    );
    let session = s["sessionId"].as_str().unwrap().to_owned();
    let expr = "(() => { const v = document.getElementById('player'); \
                const s = document.getElementById('status'); \
                return JSON.stringify({t: v ? v.currentTime : -1, s: s ? s.textContent : ''}); })()";
    let mut best = 0.0f64;
    let end = Instant::now() + Duration::from_secs(30);
    let mut status = String::new();
    while Instant::now() < end && best < 1.5 {
        let r = call(
            Some(&session),
            "Runtime.evaluate",
            serde_json::json!({"expression": expr, "returnByValue": true}),
        );
        if let Some(v) = r["result"]["value"].as_str() {
            let v: serde_json::Value = serde_json::from_str(v).unwrap();
            best = best.max(v["t"].as_f64().unwrap_or(0.0));
            status = v["s"].as_str().unwrap_or("").to_owned();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("player status: {status}");
    let p = call(
        Some(&session),
        "Page.captureScreenshot",
        serde_json::json!({"format": "png"}),
    );
    std::fs::write(shot, base64(p["data"].as_str().unwrap())).unwrap();
    let _ = call(None, "Browser.close", serde_json::json!({}));
    if let Some(c) = kid.0.first_mut() {
        let end = Instant::now() + Duration::from_secs(10);
        while c.try_wait().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(kid);
    best
}

fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c) << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}

/// `rsv media --metrics`: a GET of 1000 bytes with a Range moves the file requests
/// answered 206 by one, the bytes sent and the LUN's bytes read by 1000 and its read
/// histogram by one read; a file being streamed (to a client that reads nothing) is in
/// flight until its client goes; a missing file counts as a 404; the iSNS lookups and the on-demand login
/// count; promtool accepts what is served while the stream runs.
#[test]
fn media_metrics_count_a_ranged_get_exactly() {
    for t in ["mkfs.ext4", "curl", "promtool"] {
        if !have(t) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Larger than what the loopback's socket buffers hold, so that a client that does
    // not read keeps its stream in flight.
    let data = patterned(24 << 20);
    std::fs::write(src.join("known.mp4"), &data).unwrap();
    ext4_image(&d.join("disk.img"), &src, &[]);

    let mut kids = Kids(Vec::new());
    let (isns_addr, isns_port) = start_isns(d, &mut kids);
    let cfg = target_config(d, &isns_port, "127.0.0.1:0");
    let (target, _) = spawn_ready(
        Command::new(rsv()).arg("target").arg("-c").arg(&cfg),
        &d.join("target.log"),
    );
    kids.0.push(target);
    // `metrics ADDR` comes before `listening ADDR` and `ready`.
    let (media_child, said) = spawn_until_ready(
        Command::new(rsv())
            .args(["media", "--isns", &isns_addr, "--listen", "127.0.0.1:0"])
            .args(["--metrics", "127.0.0.1:0", "--poll", "600s"]),
        &d.join("media.log"),
    );
    kids.0.push(media_child);
    let find = |word: &str| {
        said.iter()
            .find_map(|l| l.strip_prefix(word))
            .unwrap_or_else(|| panic!("rsv media printed no {word}: {said:?}"))
            .to_owned()
    };
    let (media, metrics) = (find("listening "), find("metrics "));
    let scrape = || {
        let o = curl(&["-f", &format!("http://{metrics}/metrics")]);
        assert!(o.status.success(), "scraping: {o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    // The storage listed, its file system read: logged in on demand.
    wait_until(20, "the storage's file to be listed", || {
        listing(&media)["storages"][0]["volumes"][0]["files"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    });
    let file = format!("http://{media}/media/home/0/known.mp4");
    let partial = "rsv_media_http_requests_total{route=\"file\",status=\"206\"}";
    let sent = "rsv_media_http_sent_bytes_total";
    let read = "rsv_media_lun_read_bytes_total{storage=\"home\",lun=\"0\"}";
    let reads = "rsv_media_lun_read_duration_seconds_count{storage=\"home\",lun=\"0\"}";

    let before = scrape();
    let got = curl(&["-f", "-H", "Range: bytes=1000-1999", &file]);
    assert!(got.status.success(), "{got:?}");
    assert!(got.stdout == data[1000..2000], "the wrong bytes");
    let after = scrape();
    let moved = |name: &str| series(&after, name) - series(&before, name);
    assert_eq!(moved(partial), 1.0, "{after}");
    assert_eq!(moved(sent), 1000.0, "{after}");
    assert_eq!(moved(read), 1000.0, "{after}");
    assert_eq!(moved(reads), 1.0, "{after}");
    wait_until(10, "the answer's stream to end", || {
        series(&scrape(), "rsv_media_streams_in_flight") == 0.0
    });
    assert_eq!(series(&after, "rsv_media_sessions"), 1.0, "{after}");
    assert_eq!(series(&after, "rsv_media_storages"), 1.0, "{after}");
    assert!(series(&after, "rsv_media_logins_total{result=\"ok\"}") >= 1.0);
    assert!(series(&after, "rsv_media_isns_lookups_total{result=\"ok\"}") >= 1.0);

    // The whole file to a client that asks and reads nothing: in flight until it goes.
    let mut idle = std::net::TcpStream::connect(&media).unwrap();
    idle.write_all(b"GET /media/home/0/known.mp4 HTTP/1.1\r\nHost: m\r\n\r\n")
        .unwrap();
    let mut streaming = String::new();
    wait_until(20, "the stream to be in flight", || {
        streaming = scrape();
        series(&streaming, "rsv_media_streams_in_flight") == 1.0
    });
    promtool_check(&streaming);
    drop(idle);
    wait_until(30, "the stream to end with its client", || {
        series(&scrape(), "rsv_media_streams_in_flight") == 0.0
    });

    let missing = curl(&[&format!("http://{media}/media/home/0/nothing.mp4")]);
    assert!(missing.status.success());
    let not_found = "rsv_media_http_requests_total{route=\"file\",status=\"404\"}";
    assert_eq!(series(&scrape(), not_found), 1.0);
}
