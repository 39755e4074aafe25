//! Login of the session's connections: the leading one and the others, again after a
//! reinstatement, and each connection's start in full feature phase.

use std::sync::Arc;

use iscsi::login::{ChapCredentials, InitiatorLoginConfig, SessionType};
use iscsi::negotiate::{ConnectionParams, SessionParams, TargetPacing};
use iscsi::serial::sn_gt;

use super::reader::reader;
use super::{SessionInfo, Shared};
use crate::conn::{Conn, LoginDone, RawConn};
use crate::{Error, IscsiUrl, Result, SessionOptions};

pub(crate) fn new_isid() -> [u8; 6] {
    let r: [u8; 4] = rand::random();
    // Type 0x80: random format (RFC 7143 11.12.5).
    [0x80, r[0], r[1], r[2], 0, r[3] | 1]
}

pub(crate) fn chap(url: &IscsiUrl, opts: &SessionOptions) -> Option<ChapCredentials> {
    let user = url.user.clone()?;
    Some(ChapCredentials {
        user,
        secret: url.password.clone().unwrap_or_default().into_bytes(),
        mutual: opts.target_secret.clone().map(String::into_bytes),
        algorithms: opts.chap_algorithms.clone(),
    })
}

pub(crate) fn connection_prefs(opts: &SessionOptions) -> ConnectionParams {
    ConnectionParams {
        header_digest: opts.header_digest,
        data_digest: opts.data_digest,
        max_recv_data_segment_length: opts.max_recv_data_segment,
        ..ConnectionParams::default()
    }
}

impl Shared {
    pub(super) fn login_config(
        &self,
        cid: u16,
        tsih: u16,
        session: SessionParams,
    ) -> InitiatorLoginConfig {
        let o = &self.opts;
        InitiatorLoginConfig {
            initiator_name: o.initiator_name.clone(),
            initiator_alias: None,
            target_name: Some(self.target.clone()),
            session_type: SessionType::Normal,
            isid: self.isid,
            tsih,
            cid,
            auth: chap(&self.url, o),
            session,
            connection: connection_prefs(o),
            leading: tsih == 0,
            // With the rate control on, "0" (no pacing yet) asks whether the target knows
            // the key: only then do hints follow in full feature phase.
            pacing_hint: o.target_pacing_hint().or(self
                .tuner
                .rate
                .as_ref()
                .filter(|_| o.pacing_hint)
                .map(|_| 0)),
            // A remembered rate: the target's Data-In starts near its share too.
            start_hint: o.start_rate.filter(|_| o.pacing_hint),
            // The unknown path's probed start: the target's first Data-In finds the rate too.
            probe_hint: o.probe_rate.filter(|r| *r > 0 && o.pacing_hint),
        }
    }

    /// Logs in the leading connection and the others, and installs them as a new
    /// generation of the session.
    pub(super) async fn establish(self: &Arc<Self>) -> Result<()> {
        self.establish_over(Vec::new()).await
    }

    /// As [`Shared::establish`], on connections already made to the portal where there
    /// are some (the auto-tuning probe's). The other connections' TCP (and TLS)
    /// handshakes run while the leading one logs in, and they log in together once it
    /// has: on a long path each step one after the other cost round trips per
    /// connection.
    pub(super) async fn establish_over(
        self: &Arc<Self>,
        ready: Vec<net::transport::Stream>,
    ) -> Result<()> {
        let o = &self.opts;
        let proposal = SessionParams {
            max_connections: o.connections,
            initial_r2t: o.initial_r2t,
            immediate_data: o.immediate_data,
            max_burst_length: o.max_burst,
            first_burst_length: o.first_burst.min(o.max_burst),
            max_outstanding_r2t: 8,
            error_recovery_level: o.error_recovery_level,
            ..SessionParams::default()
        };
        let portal = self.portal();
        let mut ready = ready.into_iter();
        let open = |stream: Option<net::transport::Stream>| {
            let (portal, o) = (portal.clone(), o.clone());
            async move {
                match stream {
                    Some(s) => RawConn::over(&portal, s, &o).await,
                    None => RawConn::connect(&portal, &o).await,
                }
            }
        };
        let lead_stream = ready.next();
        // The others' handshakes start now, in the background of the leading login.
        let extras: Vec<_> = (1..o.connections.max(1))
            .map(|_| tokio::spawn(open(ready.next())))
            .collect();
        drop(ready);
        let mut raw = open(lead_stream).await?;
        let cmdsn = {
            let st = self.state.lock().unwrap();
            st.window.cmdsn
        };
        let lead = raw
            .login(self.login_config(0, 0, proposal), 0, cmdsn)
            .await?;
        let params = lead.outcome.session.clone();
        let tsih = lead.outcome.tsih;
        let tuning = raw.tuning.clone();
        let tls = raw.tls_summary();
        let mut logged_in: Vec<(RawConn, LoginDone, u16)> = vec![(raw, lead, 0)];
        let want = o.connections.min(params.max_connections).max(1);
        let mut logins = Vec::new();
        for (i, extra) in extras.into_iter().enumerate() {
            let cid = i as u16 + 1;
            if cid >= want {
                // Granted fewer: the connection closes unused.
                extra.abort();
                continue;
            }
            let config = self.login_config(cid, tsih, params.clone());
            logins.push(tokio::spawn(async move {
                let mut raw = extra
                    .await
                    .map_err(|e| Error::Protocol(format!("connection set-up: {e}")))??;
                let done = raw.login(config, u32::from(cid), cmdsn).await?;
                Ok::<_, Error>((raw, done, cid))
            }));
        }
        let late = o.join_late && !logins.is_empty();
        let logins = if late {
            logins
        } else {
            for (i, login) in logins.into_iter().enumerate() {
                let cid = i + 1;
                match login.await {
                    Ok(Ok(c)) => logged_in.push(c),
                    Ok(Err(e)) => {
                        tracing::warn!("connection {cid} of the session could not log in: {e}")
                    }
                    Err(e) => tracing::warn!("connection {cid} of the session: {e}"),
                }
            }
            Vec::new()
        };
        let first = &logged_in[0].1;
        let conn_params = first.outcome.connection.clone();
        let (expcmdsn, maxcmdsn) =
            logged_in
                .iter()
                .fold((first.expcmdsn, first.maxcmdsn), |(e, m), (_, d, _)| {
                    (
                        if sn_gt(d.expcmdsn, e) { d.expcmdsn } else { e },
                        if sn_gt(d.maxcmdsn, m) { d.maxcmdsn } else { m },
                    )
                });
        let mut st = self.state.lock().unwrap();
        let gen = st.conns.gen + 1;
        let mut conns = Vec::new();
        for (raw, done, cid) in logged_in {
            conns.push(self.start_conn(raw, &done, cid, gen));
        }
        for old in std::mem::replace(&mut st.conns.all, conns) {
            old.kill();
        }
        st.conns.gen = gen;
        st.window.cmdsn = cmdsn;
        st.window.expcmdsn = expcmdsn;
        st.window.maxcmdsn = maxcmdsn;
        st.tasks.by_itt.clear();
        st.conns.losses.clear();
        st.conns.tsih = tsih;
        st.conns.info = Some(SessionInfo {
            target: self.target.clone(),
            portal,
            isid: self.isid.iter().map(|b| format!("{b:02x}")).collect(),
            tsih,
            connections: st.conns.all.len(),
            max_connections: params.max_connections,
            initial_r2t: params.initial_r2t,
            immediate_data: params.immediate_data,
            max_burst_length: params.max_burst_length,
            first_burst_length: params.first_burst_length,
            max_recv_data_segment_length: conn_params.max_recv_data_segment_length,
            max_send_data_segment_length: conn_params.max_send_data_segment_length,
            header_digest: conn_params.header_digest,
            data_digest: conn_params.data_digest,
            error_recovery_level: params.error_recovery_level,
            queue_depth: o.queue_depth,
            congestion: tuning.congestion,
            congestion_by_connection: Vec::new(),
            start_found_by_connection: Vec::new(),
            congestion_choice: None,
            rsv: net::cc::status(),
            send_buffer: tuning.send_buffer,
            recv_buffer: tuning.recv_buffer,
            tuning: None,
            path: None,
            target_pacing: Default::default(),
            rate_control: None,
            tls,
            multipath: None,
        });
        st.conns.params = params;
        drop(st);
        self.window_waiters.notify_waiters();
        if !logins.is_empty() {
            // The others join as their logins finish (join_late).
            let me = Arc::downgrade(self);
            tokio::spawn(async move {
                for (i, login) in logins.into_iter().enumerate() {
                    let cid = i + 1;
                    match login.await {
                        Ok(Ok((raw, done, cid))) => match me.upgrade() {
                            Some(s) => s.join(raw, &done, cid, gen),
                            None => return,
                        },
                        Ok(Err(e)) => {
                            tracing::warn!("connection {cid} of the session could not log in: {e}")
                        }
                        Err(e) => tracing::warn!("connection {cid} of the session: {e}"),
                    }
                }
            });
        }
        Ok(())
    }

    /// A connection logged in after the session started (join_late) joins generation
    /// `gen`, unless the session was closed or reinstated meanwhile (it is then dropped).
    fn join(self: &Arc<Self>, raw: RawConn, done: &LoginDone, cid: u16, gen: u64) {
        let mut st = self.state.lock().unwrap();
        if st.conns.gen != gen || st.conns.closed {
            return;
        }
        let conn = self.start_conn(raw, done, cid, gen);
        st.conns.all.push(conn);
        if sn_gt(done.maxcmdsn, st.window.maxcmdsn) {
            st.window.maxcmdsn = done.maxcmdsn;
        }
        let n = st.conns.all.len();
        if let Some(info) = st.conns.info.as_mut() {
            info.connections = n;
        }
        drop(st);
        tracing::debug!(cid, "connection joined the session");
        self.window_waiters.notify_waiters();
    }

    /// Turns a logged-in connection into a running one of generation `gen`.
    pub(super) fn start_conn(
        self: &Arc<Self>,
        raw: RawConn,
        done: &LoginDone,
        cid: u16,
        gen: u64,
    ) -> Arc<Conn> {
        let exp_statsn = raw.exp_statsn;
        let portal = raw.portal.clone();
        let congestion = raw.tuning.congestion.clone();
        let (r, w, buf, dec, digests) = raw.into_parts();
        let (conn, dead) = Conn::new(
            cid,
            gen,
            portal,
            done.outcome.connection.max_send_data_segment_length,
            exp_statsn,
            w,
            digests,
            done.outcome.pacing,
        );
        if let Some(c) = congestion {
            let _ = conn.congestion.set(c);
        }
        match done.outcome.pacing {
            TargetPacing::NotAsked => {}
            TargetPacing::Paced(r) => tracing::debug!(
                cid,
                "the target paces this connection's Data-In at {:.1} Mbit/s",
                r as f64 * 8e-6
            ),
            other => tracing::debug!(
                cid,
                "the target does not pace this connection's Data-In (pacing hint {})",
                other.as_str()
            ),
        }
        tokio::spawn(reader(
            Arc::downgrade(self),
            conn.clone(),
            r,
            buf,
            dec,
            dead,
        ));
        conn
    }
}
