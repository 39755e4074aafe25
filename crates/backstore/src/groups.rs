//! ALUA target port groups whose states the targets exporting one store agree on through
//! the store itself (a gateway group on one RBD image): the words the logical unit and
//! such a store share. The logical unit encodes them (REPORT TARGET PORT GROUPS), the
//! store keeps them (each target's liveness and the states SET TARGET PORT GROUPS chose).

use std::io;
use std::sync::Arc;

/// An asymmetric access state (SPC-4 5.16.2.4), with its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
}

impl AccessState {
    /// The ASYMMETRIC ACCESS STATE field's code.
    pub fn code(self) -> u8 {
        match self {
            AccessState::ActiveOptimized => 0x0,
            AccessState::ActiveNonOptimized => 0x1,
            AccessState::Standby => 0x2,
            AccessState::Unavailable => 0x3,
            AccessState::Transitioning => 0xf,
        }
    }

    pub fn from_code(code: u8) -> Option<AccessState> {
        Some(match code {
            0x0 => AccessState::ActiveOptimized,
            0x1 => AccessState::ActiveNonOptimized,
            0x2 => AccessState::Standby,
            0x3 => AccessState::Unavailable,
            0xf => AccessState::Transitioning,
            _ => return None,
        })
    }

    /// A short name, for logs, `--json` and what the store keeps.
    pub fn name(self) -> &'static str {
        match self {
            AccessState::ActiveOptimized => "active/optimized",
            AccessState::ActiveNonOptimized => "active/non-optimized",
            AccessState::Standby => "standby",
            AccessState::Unavailable => "unavailable",
            AccessState::Transitioning => "transitioning",
        }
    }

    pub fn from_name(name: &str) -> Option<AccessState> {
        [
            AccessState::ActiveOptimized,
            AccessState::ActiveNonOptimized,
            AccessState::Standby,
            AccessState::Unavailable,
            AccessState::Transitioning,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    /// Active (optimized or not): every command is served.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            AccessState::ActiveOptimized | AccessState::ActiveNonOptimized
        )
    }
}

/// Why a group is in its state: REPORT TARGET PORT GROUPS' STATUS CODE (SPC-4 6.37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Why {
    /// No status: the state the group started in.
    None,
    /// Altered by SET TARGET PORT GROUPS.
    Explicit,
    /// Altered by the targets themselves (a target lost or back).
    Implicit,
}

impl Why {
    pub fn code(self) -> u8 {
        match self {
            Why::None => 0,
            Why::Explicit => 1,
            Why::Implicit => 2,
        }
    }
}

/// One target port group as this target sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    pub group: u16,
    pub state: AccessState,
    pub why: Why,
}

/// The target port groups of the targets that export a store, kept by the store.
pub trait PortGroups: Send + Sync + std::fmt::Debug {
    /// Every group, this target's among them, in the order of their ids.
    fn states(&self) -> Vec<GroupState>;
    /// This target's own group's state now: a target that has lost its store's cluster
    /// sees itself transitioning, then unavailable, and refuses I/O so.
    fn own(&self) -> AccessState;
    /// Seconds an implicit transition may take: REPORT TARGET PORT GROUPS' IMPLICIT
    /// TRANSITION TIME.
    fn transition_time(&self) -> u8;
    /// SET TARGET PORT GROUPS: the states chosen, kept where every target reads them, and
    /// every target told; returns once they have taken it (or the store's deadline
    /// passed). Blocks: call it where blocking is allowed.
    fn set(&self, states: &[(u16, AccessState)]) -> io::Result<()>;
    /// What to call when any group's state changes (on a thread of the store's), before
    /// the target that changed it hears back: the logical unit raises ASYMMETRIC ACCESS
    /// STATE CHANGED on its nexuses.
    fn on_change(&self, f: Arc<dyn Fn() + Send + Sync>);
}
