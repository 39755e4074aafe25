//! The session's command window: the next CmdSN and the target's ExpCmdSN and MaxCmdSN.

use iscsi::serial::{sn_gt, sn_le, sn_lt};

use super::Shared;

/// Lives in the session's state, under its lock: a command takes its CmdSN in the same
/// critical section as its connection and ITT, and queues its PDU there.
pub(super) struct Window {
    /// The CmdSN the next command gets.
    pub(super) cmdsn: u32,
    pub(super) expcmdsn: u32,
    pub(super) maxcmdsn: u32,
}

impl Window {
    pub(super) fn new(cmdsn: u32, expcmdsn: u32, maxcmdsn: u32) -> Window {
        Window {
            cmdsn,
            expcmdsn,
            maxcmdsn,
        }
    }

    /// The target takes another command now.
    pub(super) fn is_open(&self) -> bool {
        sn_le(self.cmdsn, self.maxcmdsn)
    }

    /// The CmdSN for a new command, which advances the window's next one.
    pub(super) fn take(&mut self) -> u32 {
        let cmdsn = self.cmdsn;
        self.cmdsn = cmdsn.wrapping_add(1);
        cmdsn
    }

    /// Takes the target's ExpCmdSN and MaxCmdSN where they move forward; true when the
    /// window opened further.
    fn advance(&mut self, expcmdsn: u32, maxcmdsn: u32) -> bool {
        // RFC 7143 4.2.2.1: MaxCmdSN < ExpCmdSN - 1 is invalid and ignored.
        if sn_lt(maxcmdsn, expcmdsn.wrapping_sub(1)) {
            return false;
        }
        if sn_gt(expcmdsn, self.expcmdsn) {
            self.expcmdsn = expcmdsn;
        }
        if sn_gt(maxcmdsn, self.maxcmdsn) {
            self.maxcmdsn = maxcmdsn;
            return true;
        }
        false
    }
}

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
