//! TLS 1.3 record protection on one core, aws-lc-rs against ring, as `net::record` does
//! it with each: 1 MiB of plaintext sealed into 16 KiB records and opened again in place,
//! the data hot in the cache; timed in the thread's CPU seconds (a shared machine's load
//! does not count). aws-lc-rs seals out of place (`seal_out_of_place_scatter`:
//! the plaintext read once, written once); ring has no out-of-place seal, so the
//! plaintext is copied into the record first and sealed there (`seal_in_place_separate_tag`).
//!
//!   cargo run --release --bin records [GIB]      (default 4 GiB per row)

/// This thread's CPU time in seconds: robust when the machine is shared, where wall
/// time is not.
fn cpu_now() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

struct Instant(f64);
impl Instant {
    fn now() -> Instant {
        Instant(cpu_now())
    }
    fn elapsed(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(cpu_now() - self.0)
    }
}

const REC: usize = 1 << 14;
const CHUNK: usize = 1 << 20;
const OVER: usize = 5 + 1 + 16;

fn hdr(body: usize) -> [u8; 5] {
    let l = (body as u16).to_be_bytes();
    [23, 3, 3, l[0], l[1]]
}

fn nonce_bytes(seq: u64) -> [u8; 12] {
    let mut n = [7u8; 12];
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    n
}

trait Cipher {
    /// Seals `plain` into `out` as 64 records from sequence number `seq`; bytes written.
    fn seal(&self, seq: &mut u64, plain: &[u8], out: &mut [u8]) -> usize;
    /// Opens `rec` (one record, header included) in place; plaintext length (with type).
    fn open(&self, seq: u64, rec: &mut [u8]) -> usize;
}

struct Aws(aws_lc_rs::aead::LessSafeKey);
struct Ring(ring::aead::LessSafeKey);

impl Cipher for Aws {
    fn seal(&self, seq: &mut u64, plain: &[u8], out: &mut [u8]) -> usize {
        use aws_lc_rs::aead::{Aad, Nonce};
        let mut at = 0;
        for p in plain.chunks(REC) {
            let body = p.len() + 17;
            let h = hdr(body);
            out[at..at + 5].copy_from_slice(&h);
            let (ct, extra) = out[at + 5..at + 5 + body].split_at_mut(p.len());
            let n = Nonce::assume_unique_for_key(nonce_bytes(*seq));
            self.0
                .seal_out_of_place_scatter(n, Aad::from(h), p, ct, &[23], extra)
                .unwrap();
            *seq += 1;
            at += 5 + body;
        }
        at
    }
    fn open(&self, seq: u64, rec: &mut [u8]) -> usize {
        use aws_lc_rs::aead::{Aad, Nonce};
        let h: [u8; 5] = rec[..5].try_into().unwrap();
        let n = Nonce::assume_unique_for_key(nonce_bytes(seq));
        self.0.open_in_place(n, Aad::from(h), &mut rec[5..]).unwrap().len()
    }
}

impl Cipher for Ring {
    fn seal(&self, seq: &mut u64, plain: &[u8], out: &mut [u8]) -> usize {
        use ring::aead::{Aad, Nonce};
        let mut at = 0;
        for p in plain.chunks(REC) {
            let body = p.len() + 17;
            let h = hdr(body);
            let rec = &mut out[at..at + 5 + body];
            rec[..5].copy_from_slice(&h);
            rec[5..5 + p.len()].copy_from_slice(p);
            rec[5 + p.len()] = 23;
            let (inout, tag_out) = rec[5..].split_at_mut(p.len() + 1);
            let n = Nonce::assume_unique_for_key(nonce_bytes(*seq));
            let tag = self.0.seal_in_place_separate_tag(n, Aad::from(h), inout).unwrap();
            tag_out.copy_from_slice(tag.as_ref());
            *seq += 1;
            at += 5 + body;
        }
        at
    }
    fn open(&self, seq: u64, rec: &mut [u8]) -> usize {
        use ring::aead::{Aad, Nonce};
        let h: [u8; 5] = rec[..5].try_into().unwrap();
        let n = Nonce::assume_unique_for_key(nonce_bytes(seq));
        self.0.open_in_place(n, Aad::from(h), &mut rec[5..]).unwrap().len()
    }
}

fn row(name: &str, c: &dyn Cipher, rounds: usize) {
    let plain: Vec<u8> = (0..CHUNK).map(|i| (i * 7 + 1) as u8).collect();
    let mut wire = vec![0u8; CHUNK + 64 * OVER];
    let mut seq = 0;
    let t = Instant::now();
    for _ in 0..rounds {
        c.seal(&mut seq, &plain, &mut wire);
    }
    let seal_s = t.elapsed().as_secs_f64();
    let len = c.seal(&mut 0, &plain, &mut wire);
    let sealed = wire[..len].to_vec();
    let mut open_s = 0f64;
    for _ in 0..rounds {
        wire[..len].copy_from_slice(&sealed);
        let t = Instant::now();
        let (mut at, mut seq, mut got) = (0, 0u64, 0);
        while at < len {
            let body = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
            got += c.open(seq, &mut wire[at..at + 5 + body]) - 1;
            seq += 1;
            at += 5 + body;
        }
        open_s += t.elapsed().as_secs_f64();
        assert_eq!(got, CHUNK);
    }
    let gib = (rounds as f64) / 1024.0;
    println!(
        "{name:<28} seal {:.3} s/GiB ({:.1} GB/s)  open in place {:.3} s/GiB ({:.1} GB/s)",
        seal_s / gib,
        (rounds * CHUNK) as f64 / seal_s / 1e9,
        open_s / gib,
        (rounds * CHUNK) as f64 / open_s / 1e9
    );
}

fn main() {
    let gib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let rounds = gib << 10;
    use aws_lc_rs::aead as a;
    use ring::aead as r;
    let key = [3u8; 32];
    let aws = |alg, n| Aws(a::LessSafeKey::new(a::UnboundKey::new(alg, &key[..n]).unwrap()));
    let ring = |alg, n| Ring(r::LessSafeKey::new(r::UnboundKey::new(alg, &key[..n]).unwrap()));
    // Each pair one after the other, twice, so that a busy moment shows as a disagreement.
    for _ in 0..2 {
        row("aws-lc-rs AES-128-GCM", &aws(&a::AES_128_GCM, 16), rounds);
        row("ring      AES-128-GCM", &ring(&r::AES_128_GCM, 16), rounds);
        row("aws-lc-rs AES-256-GCM", &aws(&a::AES_256_GCM, 32), rounds);
        row("ring      AES-256-GCM", &ring(&r::AES_256_GCM, 32), rounds);
        row("aws-lc-rs ChaCha20-Poly1305", &aws(&a::CHACHA20_POLY1305, 32), rounds / 4);
        row("ring      ChaCha20-Poly1305", &ring(&r::CHACHA20_POLY1305, 32), rounds / 4);
    }
}
