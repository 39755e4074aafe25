//! Benchmark (not a test): what TLS 1.3's record protection costs one core here, per GiB,
//! as `net::record` does it: 1 MiB of plaintext sealed into 16 KiB records (read once,
//! written once: `seal_out_of_place_scatter`), and opened three ways: in place (the
//! cipher alone), in place and then copied to a 1 MiB destination (what `net::tlsconn`'s
//! receiver does), and out of place straight into the destination.
//!
//!   cargo run --release -p net --example record_speed [GIB]     (default 4 GiB per row)

use std::time::Instant;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

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
        let (ct, extra) = out[at + 5..at + 5 + body].split_at_mut(p.len());
        k.seal_out_of_place_scatter(nonce(*seq), Aad::from(h), p, ct, &[23], extra)
            .unwrap();
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
        let mut row = vec![("seal (out of place)", seal_s)];
        for mode in [
            "open in place",
            "open in place + copy",
            "open into destination",
        ] {
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
                    match mode {
                        "open into destination" => {
                            let (ct, tag) = wire[at + 5..at + 5 + body].split_at(body - 16);
                            ok.open_separate_gather(
                                nonce(rseq),
                                Aad::from(h),
                                ct,
                                tag,
                                &mut dst[d..d + n + 1],
                            )
                            .unwrap();
                        }
                        _ => {
                            let p = ok
                                .open_in_place(
                                    nonce(rseq),
                                    Aad::from(h),
                                    &mut wire[at + 5..at + 5 + body],
                                )
                                .unwrap();
                            if mode == "open in place + copy" {
                                dst[d..d + n].copy_from_slice(&p[..n]);
                            }
                        }
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
