//! Benchmark (not a test): what TLS 1.3's record protection costs one core here, per GiB,
//! as `net::record` does it with ring: 1 MiB of plaintext copied into 16 KiB records and
//! sealed there (ring seals in place only), and opened two ways: in place (the cipher
//! alone), and in place then copied to a 1 MiB destination (what `net::tlsconn`'s
//! receiver does). `scripts/tls-provider-bench` (`--bin records`) sets ring against
//! aws-lc-rs, which seals out of place.
//!
//!   cargo run --release -p net --example record_speed [GIB]     (default 4 GiB per row)

use std::time::Instant;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

const REC: usize = 1 << 14;
const CHUNK: usize = 1 << 20;
const OVER: usize = 5 + 1 + 16;

fn nonce(seq: u64) -> Nonce {
    let mut n = [7u8; 12];
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    Nonce::assume_unique_for_key(n)
}

fn hdr(body: usize) -> [u8; 5] {
    let l = (body as u16).to_be_bytes();
    [23, 3, 3, l[0], l[1]]
}

/// 1 MiB sealed into `out` as 64 records; returns the bytes written.
fn seal(k: &LessSafeKey, seq: &mut u64, plain: &[u8], out: &mut [u8]) -> usize {
    let mut at = 0;
    for p in plain.chunks(REC) {
        let body = p.len() + 17;
        let h = hdr(body);
        out[at..at + 5].copy_from_slice(&h);
        let rec = &mut out[at + 5..at + 5 + body];
        rec[..p.len()].copy_from_slice(p);
        rec[p.len()] = 23;
        let (inout, tag_out) = rec.split_at_mut(p.len() + 1);
        let tag = k
            .seal_in_place_separate_tag(nonce(*seq), Aad::from(h), inout)
            .unwrap();
        tag_out.copy_from_slice(tag.as_ref());
        *seq += 1;
        at += 5 + body;
    }
    at
}

fn main() {
    let gib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4);
    let rounds = gib << 10;
    for (name, alg, klen) in [
        ("AES-128-GCM", &aead::AES_128_GCM, 16),
        ("AES-256-GCM", &aead::AES_256_GCM, 32),
        ("ChaCha20-Poly1305", &aead::CHACHA20_POLY1305, 32),
    ] {
        let k = || LessSafeKey::new(UnboundKey::new(alg, &[3u8; 32][..klen]).unwrap());
        let (sk, ok) = (k(), k());
        let plain: Vec<u8> = (0..CHUNK).map(|i| (i * 7 + 1) as u8).collect();
        let mut wire = vec![0u8; CHUNK + 64 * OVER];
        let mut dst = vec![0u8; CHUNK + 1];
        let mut seq = 0u64;
        // Seal: the figure for the sender.
        let t = Instant::now();
        for _ in 0..rounds {
            seal(&sk, &mut seq, &plain, &mut wire);
        }
        let seal_s = t.elapsed().as_secs_f64();
        // The records of one MiB sealed from sequence number 0, opened again each round.
        let len = seal(&sk, &mut 0, &plain, &mut wire);
        let sealed = wire[..len].to_vec();
        let mut row = vec![("seal (copy, in place)", seal_s)];
        for mode in ["open in place", "open in place + copy"] {
            let mut total = 0f64;
            for _ in 0..rounds {
                wire[..len].copy_from_slice(&sealed);
                let mut rseq = 0u64;
                let t = Instant::now();
                let (mut at, mut d) = (0, 0);
                while at < len {
                    let body = u16::from_be_bytes([wire[at + 3], wire[at + 4]]) as usize;
                    let h: [u8; 5] = wire[at..at + 5].try_into().unwrap();
                    let n = body - 17;
                    let p = ok
                        .open_in_place(nonce(rseq), Aad::from(h), &mut wire[at + 5..at + 5 + body])
                        .unwrap();
                    if mode == "open in place + copy" {
                        dst[d..d + n].copy_from_slice(&p[..n]);
                    }
                    rseq += 1;
                    at += 5 + body;
                    d += n;
                }
                total += t.elapsed().as_secs_f64();
                assert_eq!(d, CHUNK);
            }
            if mode != "open in place" {
                assert_eq!(&dst[..CHUNK], &plain[..]);
            }
            row.push((mode, total));
        }
        let per_gib = |s: f64| s / gib as f64;
        print!("{name:<18}");
        for (m, s) in &row {
            print!(
                "  {m}: {:.3} s/GiB ({:.1} GB/s)",
                per_gib(*s),
                (gib << 30) as f64 / s / 1e9
            );
        }
        println!();
    }
}
