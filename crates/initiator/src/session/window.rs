//! The session's command window: the next CmdSN and the target's ExpCmdSN and MaxCmdSN.

use super::Shared;

/// The rules are `iscsi::ffp`'s; the window lives in the session's state, under its lock:
/// a command takes its CmdSN in the same critical section as its connection and ITT, and
/// queues its PDU there.
pub(super) use iscsi::ffp::CmdWindow as Window;

impl Shared {
    /// Takes the window from a PDU of the target and wakes the commands waiting for it
    /// when it opened.
    pub(super) fn update_window(&self, expcmdsn: u32, maxcmdsn: u32) {
        let opened = self
            .state
            .lock()
            .unwrap()
            .window
            .advance(expcmdsn, maxcmdsn);
        if opened {
            self.window_waiters.notify_waiters();
        }
    }
}
