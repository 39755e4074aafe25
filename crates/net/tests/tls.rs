//! The TLS carrier over loopback with certificates made here: bytes both ways through the
//! split halves (non-blocking vectored writes included), the socket under it lent out,
//! and each way a handshake fails told in one line on both sides.

use std::io::IoSlice;
use std::path::Path;

use net::testcerts::{self, Ca};
use net::tls::{ClientFiles, ClientTls, ServerFiles, ServerTls};
use net::transport::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A directory for one test's certificates, removed when the test ends.
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("net-tls-{name}-"))
        .tempdir()
        .unwrap()
}

fn server(cert: &Path, key: &Path, client_ca: Option<&Path>) -> ServerTls {
    ServerTls::new(&ServerFiles {
        cert: cert.into(),
        key: key.into(),
        client_ca: client_ca.map(Into::into),
    })
    .unwrap()
}

/// One handshake over loopback: the client's and the server's result.
async fn handshake(
    server: Option<&ServerTls>,
    client: &ClientTls,
    host: &str,
) -> (std::io::Result<Stream>, std::io::Result<Stream>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let srv = async {
        let (tcp, _) = l.accept().await.unwrap();
        match server {
            Some(s) => Stream::tls_accept(tcp, s).await,
            // A plaintext portal: reads what comes and closes, as an iSCSI target does
            // with a PDU it cannot frame.
            None => {
                let mut tcp = tcp;
                let mut b = [0u8; 48];
                let _ = tcp.read_exact(&mut b).await;
                drop(tcp);
                Err(std::io::Error::other("closed as a plaintext target does"))
            }
        }
    };
    let cli = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        Stream::tls_connect(tcp, client, host).await
    };
    tokio::join!(cli, srv)
}

#[tokio::test]
async fn tls_carries_bytes_both_ways_through_the_halves() {
    let d = dir("bytes");
    let ca = Ca::new(d.path(), "ca");
    let leaf = ca.issue(d.path(), "target", &["localhost", "127.0.0.1"], false);
    let s = server(&leaf.cert, &leaf.key, None);
    let c = ClientTls::new(&ClientFiles {
        ca: Some(ca.cert.clone()),
        ..Default::default()
    })
    .unwrap();
    let (client, accepted) = handshake(Some(&s), &c, "127.0.0.1").await;
    let mut client = client.unwrap();
    let server = accepted.unwrap();
    assert!(client.is_tls() && server.is_tls());
    let summary = client.tls_summary().unwrap();
    assert!(summary.starts_with("TLSv1_3 TLS13_"), "{summary}");
    assert!(net::tcp_info(client.socket().unwrap()).is_ok());
    assert_eq!(client.peer_addr().unwrap(), server.local_addr().unwrap());

    let (mut rd, mut wr) = server.into_split();
    assert!(wr.copies_in_user_space());
    assert!(net::tcp_info(rd.socket().unwrap()).is_ok());
    assert!(net::tcp_info(wr.socket().unwrap()).is_ok());
    let parts = [IoSlice::new(b"ab"), IoSlice::new(b"cd")];
    let mut n = 0;
    while n == 0 {
        n = wr.try_write_vectored(&parts).unwrap();
    }
    wr.write_all(&b"abcd"[n..]).await.unwrap();
    // 1 MiB, more than the TLS session buffers: reader and writer run at once.
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let sender = {
        let big = big.clone();
        tokio::spawn(async move {
            wr.write_all(&big).await.unwrap();
            wr.flush().await.unwrap();
            wr
        })
    };
    let mut got = vec![0u8; 4 + big.len()];
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got[..4], b"abcd");
    assert!(got[4..] == big[..]);
    let _wr = sender.await.unwrap();

    client.write_all(b"ping").await.unwrap();
    client.flush().await.unwrap();
    let mut back = [0u8; 4];
    rd.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}

#[tokio::test]
async fn a_pinned_self_signed_certificate_is_trusted_and_no_other() {
    let d = dir("pin");
    let own = testcerts::self_signed(d.path(), "own", &["target.example"]);
    let other = testcerts::self_signed(d.path(), "other", &["target.example"]);
    let s = server(&own.cert, &own.key, None);
    let pinned = |fp: &str| {
        ClientTls::new(&ClientFiles {
            pin: Some(net::tls::parse_fingerprint(fp).unwrap()),
            ..Default::default()
        })
        .unwrap()
    };
    // Pinned: neither the name (an address here) nor the issuer matters.
    let (c, a) = handshake(Some(&s), &pinned(&own.fingerprint), "127.0.0.1").await;
    assert!(c.is_ok() && a.is_ok());
    let (c, a) = handshake(Some(&s), &pinned(&other.fingerprint), "127.0.0.1").await;
    let e = c.unwrap_err().to_string();
    assert!(
        e.starts_with("the target's certificate is not trusted: its fingerprint sha256:")
            && e.ends_with("is not the pinned one"),
        "{e}"
    );
    let e = a.unwrap_err().to_string();
    assert!(
        e.starts_with("the initiator rejected our certificate"),
        "{e}"
    );
}

#[tokio::test]
async fn each_failed_handshake_names_its_cause_on_both_sides() {
    let d = dir("fail");
    let ca = Ca::new(d.path(), "ca");
    let good = ca.issue(d.path(), "good", &["localhost"], false);
    let expired = ca.issue(d.path(), "expired", &["localhost"], true);
    let stranger = testcerts::self_signed(d.path(), "stranger", &["localhost"]);
    let trusting = ClientTls::new(&ClientFiles {
        ca: Some(ca.cert.clone()),
        ..Default::default()
    })
    .unwrap();
    let cases: [(&str, Option<ServerTls>, &str, &str, &str); 4] = [
        (
            "untrusted",
            Some(server(&stranger.cert, &stranger.key, None)),
            "localhost",
            "the target's certificate is not trusted: signed by an unknown issuer (give ca=FILE",
            "the initiator rejected our certificate (TLS alert UnknownCA)",
        ),
        (
            "expired",
            Some(server(&expired.cert, &expired.key, None)),
            "localhost",
            "the target's certificate is not trusted: it has expired",
            "the initiator rejected our certificate (TLS alert CertificateExpired)",
        ),
        (
            "name",
            Some(server(&good.cert, &good.key, None)),
            "127.0.0.1",
            "the target's certificate is not trusted: it does not carry the name we connected to",
            "the initiator rejected our certificate (TLS alert BadCertificate)",
        ),
        (
            "plaintext portal",
            None,
            "localhost",
            "the portal closed the connection during the TLS handshake: it does not speak TLS",
            "",
        ),
    ];
    for (what, s, host, client_says, server_says) in cases {
        let (c, a) = handshake(s.as_ref(), &trusting, host).await;
        let e = c
            .err()
            .unwrap_or_else(|| panic!("{what}: handshake passed"))
            .to_string();
        assert!(e.starts_with(client_says), "{what}: {e}");
        assert!(!e.contains('\n'));
        if !server_says.is_empty() {
            let e = a
                .err()
                .unwrap_or_else(|| panic!("{what}: accepted"))
                .to_string();
            assert!(e.starts_with(server_says), "{what}: {e}");
        }
    }
}

#[tokio::test]
async fn mutual_tls_wants_a_client_certificate_from_the_ca() {
    let d = dir("mutual");
    let ca = Ca::new(d.path(), "ca");
    let clients = Ca::new(d.path(), "clients");
    let leaf = ca.issue(d.path(), "target", &["localhost"], false);
    let me = clients.issue(d.path(), "initiator", &["initiator.example"], false);
    let stranger = testcerts::self_signed(d.path(), "stranger", &["initiator.example"]);
    let s = server(&leaf.cert, &leaf.key, Some(&clients.cert));
    let client = |cert: Option<&testcerts::Files>| {
        ClientTls::new(&ClientFiles {
            ca: Some(ca.cert.clone()),
            cert: cert.map(|f| f.cert.clone()),
            key: cert.map(|f| f.key.clone()),
            ..Default::default()
        })
        .unwrap()
    };
    let (c, a) = handshake(Some(&s), &client(Some(&me)), "localhost").await;
    let (c, a) = (c.unwrap(), a.unwrap());
    assert_eq!(
        a.peer_certificate().map(|f| net::tls::fingerprint_text(&f)),
        Some(me.fingerprint.clone())
    );
    drop((c, a));
    // TLS 1.3: the client learns of the refusal on its first read after the handshake.
    let (c, a) = handshake(Some(&s), &client(None), "localhost").await;
    let e = a.unwrap_err().to_string();
    assert_eq!(
        e,
        "the initiator presented no client certificate, and this portal requires one"
    );
    let mut c = c.unwrap();
    let e = c.read_u8().await.unwrap_err().to_string();
    assert!(e.contains("CertificateRequired"), "{e}");
    let (_c, a) = handshake(Some(&s), &client(Some(&stranger)), "localhost").await;
    let e = a.unwrap_err().to_string();
    assert!(
        e.starts_with(
            "the initiator's client certificate is not trusted: signed by an unknown issuer"
        ),
        "{e}"
    );
}

#[test]
fn files_are_checked_before_any_connection() {
    let d = dir("files");
    let own = testcerts::self_signed(d.path(), "own", &["localhost"]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&own.key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = ServerTls::new(&ServerFiles {
        cert: own.cert.clone(),
        key: own.key.clone(),
        client_ca: None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.ends_with(&format!(
            "private key readable by group or others (mode 640); chmod 600 {}",
            own.key.display()
        )),
        "{e}"
    );
    let e = ClientTls::new(&ClientFiles {
        ca: Some(d.path().join("missing.crt")),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("missing.crt: No such file"), "{e}");
    let e = ServerTls::new(&ServerFiles {
        cert: own.key.clone(),
        key: own.key.clone(),
        client_ca: None,
    });
    assert!(e.is_err());
}

#[tokio::test]
async fn each_tls13_suite_is_negotiated_when_the_initiator_offers_only_it() {
    let d = dir("suites");
    let ca = Ca::new(d.path(), "ca");
    let leaf = ca.issue(d.path(), "target", &["127.0.0.1"], false);
    let s = server(&leaf.cert, &leaf.key, None);
    for (name, iana) in [
        ("aes128", "TLS13_AES_128_GCM_SHA256"),
        ("AES256", "TLS13_AES_256_GCM_SHA384"),
        (
            "TLS13_CHACHA20_POLY1305_SHA256",
            "TLS13_CHACHA20_POLY1305_SHA256",
        ),
    ] {
        let c = ClientTls::new(&ClientFiles {
            ca: Some(ca.cert.clone()),
            suite: Some(name.into()),
            ..Default::default()
        })
        .unwrap();
        let (client, accepted) = handshake(Some(&s), &c, "127.0.0.1").await;
        let client = client.unwrap();
        let server = accepted.unwrap();
        assert_eq!(client.tls_summary().unwrap(), format!("TLSv1_3 {iana}"));
        assert_eq!(server.tls_summary().unwrap(), format!("TLSv1_3 {iana}"));
    }
    let e = ClientTls::new(&ClientFiles {
        ca: Some(ca.cert.clone()),
        suite: Some("rc4".into()),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown TLS 1.3 suite \"rc4\""), "{e}");
}

/// rustls's own client (TLS 1.3 over `provider`, trusting `ca`) connected on loopback to
/// our server on `leaf`'s certificate: (their stream, ours as accepted).
async fn stock_client_to_ours(
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
    ca: &Ca,
    leaf: &testcerts::Files,
) -> (tokio_rustls::client::TlsStream<TcpStream>, Stream) {
    let mut roots = rustls::RootCertStore::empty();
    for c in net::tls::read_certs(&ca.cert).unwrap() {
        roots.add(c).unwrap();
    }
    let stock_client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(stock_client));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let ours = server(&leaf.cert, &leaf.key, None);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (theirs, accepted) = tokio::join!(
        async {
            connector
                .connect(name, TcpStream::connect(addr).await.unwrap())
                .await
        },
        async { Stream::tls_accept(l.accept().await.unwrap().0, &ours).await }
    );
    (theirs.unwrap(), accepted.unwrap())
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + seed) % 251) as u8).collect()
}

/// A stock rustls peer (tokio-rustls, rustls's own record layer) at the other end: our
/// records after the handshake must be TLS 1.3's, both ways, through KeyUpdates from
/// either side (one asking for ours in return), the server's session tickets and
/// close_notify.
#[tokio::test]
async fn a_stock_rustls_peer_reads_and_writes_our_records_through_key_updates() {
    let d = dir("stock");
    let ca = Ca::new(d.path(), "ca");
    let leaf = ca.issue(d.path(), "target", &["127.0.0.1"], false);

    // Ours as the server, theirs as the client.
    let (mut theirs, accepted) = stock_client_to_ours(net::tls::provider(), &ca, &leaf).await;
    let (mut rd, mut wr) = accepted.into_split();
    let up = pattern(300 << 10, 1);
    theirs.write_all(&up[..100 << 10]).await.unwrap();
    // A KeyUpdate that asks for ours in return.
    theirs.get_mut().1.refresh_traffic_keys().unwrap();
    theirs.write_all(&up[100 << 10..]).await.unwrap();
    theirs.flush().await.unwrap();
    let mut got = vec![0u8; up.len()];
    rd.read_exact(&mut got).await.unwrap();
    assert!(got == up);
    // Ours: the answer to theirs goes first, then one of our own after three records.
    wr.update_tls_keys_after(3);
    let down = pattern(1 << 20, 2);
    let sender = tokio::spawn(async move {
        wr.write_all(&down).await.unwrap();
        wr.shutdown().await.unwrap();
        (wr, down)
    });
    let mut got = Vec::new();
    theirs.read_to_end(&mut got).await.unwrap();
    let (_wr, down) = sender.await.unwrap();
    assert!(got == down);
    theirs.shutdown().await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(rd.read_to_end(&mut rest).await.unwrap(), 0);

    // Theirs as the server (sending two session tickets after the handshake), ours as
    // the client.
    let stock_server = rustls::ServerConfig::builder_with_provider(net::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            net::tls::read_certs(&leaf.cert).unwrap(),
            net::tls::read_key(&leaf.key).unwrap(),
        )
        .unwrap();
    assert_eq!(stock_server.send_tls13_tickets, 2);
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(stock_server));
    let c = ClientTls::new(&ClientFiles {
        ca: Some(ca.cert.clone()),
        ..Default::default()
    })
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (ours, theirs) = tokio::join!(
        async {
            Stream::tls_connect(TcpStream::connect(addr).await.unwrap(), &c, "127.0.0.1").await
        },
        async { acceptor.accept(l.accept().await.unwrap().0).await }
    );
    let mut theirs = theirs.unwrap();
    let (mut rd, mut wr) = ours.unwrap().into_split();
    let down = pattern(512 << 10, 3);
    theirs.write_all(&down[..1000]).await.unwrap();
    theirs.get_mut().1.refresh_traffic_keys().unwrap();
    theirs.write_all(&down[1000..]).await.unwrap();
    theirs.flush().await.unwrap();
    let mut got = vec![0u8; down.len()];
    rd.read_exact(&mut got).await.unwrap();
    assert!(got == down);
    let up = pattern(700 << 10, 4);
    wr.write_all(&up).await.unwrap();
    wr.flush().await.unwrap();
    let mut got = vec![0u8; up.len()];
    theirs.read_exact(&mut got).await.unwrap();
    assert!(got == up);
}

/// Large writes of owned pieces (as the target's writer sends Data-In) are sealed on the
/// sealing threads, small ones here, with KeyUpdates between: a stock rustls peer reads
/// them all, in order, and the stream ends with close_notify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_sealed_on_other_threads_reach_a_stock_peer_in_order() {
    let d = dir("sealing");
    let ca = Ca::new(d.path(), "ca");
    let leaf = ca.issue(d.path(), "target", &["127.0.0.1"], false);
    for suite in [
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
        rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ] {
        let mut provider = (*net::tls::provider()).clone();
        provider.cipher_suites.retain(|s| s.suite() == suite);
        let (mut theirs, accepted) = stock_client_to_ours(provider.into(), &ca, &leaf).await;
        let (_rd, mut wr) = accepted.into_split();
        assert!(wr.seals_elsewhere());
        // PDU-like: a 48-byte header, then payloads from 0 to 1 MiB; 24 MiB in all.
        let mut pieces = Vec::new();
        for k in 0..40 {
            pieces.push(bytes::Bytes::from(pattern(48, k)));
            let len = [1 << 20, 0, 100, 300 << 10, 5000][k % 5];
            pieces.push(bytes::Bytes::from(pattern(len, k + 1)));
        }
        let marker = |k: usize| format!("<{k:04}>").into_bytes();
        let mut expect = Vec::new();
        for (k, chunk) in pieces.chunks(7).enumerate() {
            expect.extend(chunk.iter().flat_map(|p| p.iter().copied()));
            expect.extend(marker(k));
        }
        // A KeyUpdate of ours after 40 records, then again every 40.
        wr.update_tls_keys_after(40);
        let sender = tokio::spawn(async move {
            let mut sent = 0;
            for (k, chunk) in pieces.chunks(7).enumerate() {
                let mut rest = chunk.to_vec();
                while !rest.is_empty() {
                    let n = std::future::poll_fn(|cx| wr.poll_write_shared(cx, &rest))
                        .await
                        .unwrap();
                    assert!(n > 0);
                    sent += n;
                    let mut skip = n;
                    rest.retain_mut(|p| {
                        let k = skip.min(p.len());
                        skip -= k;
                        *p = p.slice(k..);
                        !p.is_empty()
                    });
                }
                if k % 3 == 0 {
                    wr.update_tls_keys_after(40);
                }
                // A small write through the vectored path between the large ones.
                wr.write_all(&marker(k)).await.unwrap();
                sent += 6;
            }
            wr.shutdown().await.unwrap();
            sent
        });
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.unwrap();
        let sent = sender.await.unwrap();
        assert_eq!(sent, expect.len());
        assert!(got == expect, "{suite:?}: the stream differs");
    }
}
