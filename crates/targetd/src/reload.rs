//! What a configuration reload (SIGHUP) changes, worked out from the configuration in
//! force and the new one, both already read and validated; no I/O. The targets (added,
//! removed, their LUNs, aliases and access rules) and discovery's CHAP are applied while
//! the target runs; every other setting keeps its value until a restart, and the plan
//! names those that changed.

use std::collections::BTreeMap;

use crate::config::{Config, TargetConfig};

/// What a reload does.
#[derive(Debug)]
pub struct Plan {
    /// The configuration to put in force: the new targets and discovery settings, and
    /// the rest as the target started.
    pub config: Config,
    /// IQNs of targets that were not configured before.
    pub added: Vec<String>,
    /// IQNs of targets that are configured no more.
    pub removed: Vec<String>,
    /// Targets configured before and now whose settings differ.
    pub changed: Vec<TargetChange>,
    /// Discovery's CHAP changed.
    pub discovery: bool,
    /// Settings that changed but take a restart (kept as they were), by their keys.
    pub needs_restart: Vec<&'static str>,
}

/// How one target's settings changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TargetChange {
    pub iqn: String,
    pub luns_added: Vec<u16>,
    pub luns_removed: Vec<u16>,
    /// LUNs whose settings changed: each becomes a new logical unit on its new settings.
    pub luns_replaced: Vec<u16>,
    pub alias: bool,
    /// Allowed initiators, CHAP, LUN masking, require_chap, require_tls, portals.
    pub access: bool,
}

impl TargetChange {
    /// The LUNs of the target that run on unchanged.
    pub fn keeps(&self, lun: u16) -> bool {
        !self.luns_added.contains(&lun)
            && !self.luns_removed.contains(&lun)
            && !self.luns_replaced.contains(&lun)
    }
}

/// The reload from `old` (in force) to `new`; an error when `new` cannot be put in force
/// beside the settings that stay (`new` itself is already validated).
pub fn plan(old: &Config, new: &Config) -> Result<Plan, String> {
    let mut needs_restart = Vec::new();
    let mut restart = |key: &'static str, same: bool| {
        if !same {
            needs_restart.push(key);
        }
    };
    restart("portals", old.portals == new.portals);
    restart("data_dir", old.data_dir == new.data_dir);
    restart("[session]", old.session == new.session);
    restart("[isns]", old.isns == new.isns);
    restart("portal_group", old.portal_group == new.portal_group);
    restart(
        "peer_portal_groups",
        old.peer_portal_groups == new.peer_portal_groups,
    );
    restart("[threads]", old.threads == new.threads);
    restart("[control]", old.control == new.control);
    restart("[metrics]", old.metrics == new.metrics);
    let config = Config {
        targets: new.targets.clone(),
        discovery: new.discovery.clone(),
        ..old.clone()
    };
    // A target's portals, require_tls: checked against the portals that stay.
    config.validate()?;

    let key = |t: &TargetConfig| t.iqn.to_ascii_lowercase();
    let before: BTreeMap<String, &TargetConfig> = old.targets.iter().map(|t| (key(t), t)).collect();
    let after: BTreeMap<String, &TargetConfig> = new.targets.iter().map(|t| (key(t), t)).collect();
    let added = new
        .targets
        .iter()
        .filter(|t| !before.contains_key(&key(t)))
        .map(|t| t.iqn.clone())
        .collect();
    let removed = old
        .targets
        .iter()
        .filter(|t| !after.contains_key(&key(t)))
        .map(|t| t.iqn.clone())
        .collect();
    let mut changed = Vec::new();
    for t in &new.targets {
        let Some(was) = before.get(&key(t)) else {
            continue;
        };
        let c = target_change(was, t)?;
        if c != (TargetChange {
            iqn: t.iqn.clone(),
            ..TargetChange::default()
        }) {
            changed.push(c);
        }
    }
    Ok(Plan {
        config,
        added,
        removed,
        changed,
        discovery: old.discovery.chap != new.discovery.chap,
        needs_restart,
    })
}

fn target_change(was: &TargetConfig, now: &TargetConfig) -> Result<TargetChange, String> {
    let mut c = TargetChange {
        iqn: now.iqn.clone(),
        alias: was.alias != now.alias,
        access: was.allowed_initiators != now.allowed_initiators
            || was.chap != now.chap
            || was.require_tls != now.require_tls
            || was.portals != now.portals
            || was.require_chap != now.require_chap
            || was.initiators != now.initiators,
        ..TargetChange::default()
    };
    for l in &now.luns {
        match was.luns.iter().find(|w| w.id == l.id) {
            None => c.luns_added.push(l.id),
            Some(w) if w == l => {}
            // Two change maps would run on one file, each renaming the other's away.
            Some(w) if w.track || l.track => {
                return Err(format!(
                    "target {:?} LUN {}: the settings of a change-tracked LUN (track = \
                     true) change only with a restart",
                    now.iqn, l.id
                ))
            }
            Some(_) => c.luns_replaced.push(l.id),
        }
    }
    c.luns_removed = was
        .luns
        .iter()
        .filter(|w| !now.luns.iter().any(|l| l.id == w.id))
        .map(|w| w.id)
        .collect();
    Ok(c)
}

impl Plan {
    /// One line for the log: what was applied and what waits for a restart.
    pub fn summary(&self) -> String {
        let mut done: Vec<String> = Vec::new();
        done.extend(self.added.iter().map(|t| format!("target {t} added")));
        done.extend(self.removed.iter().map(|t| format!("target {t} removed")));
        for c in &self.changed {
            let mut what = Vec::new();
            let luns = |sign: &str, l: &[u16]| {
                (!l.is_empty()).then(|| {
                    let ids: Vec<String> = l.iter().map(u16::to_string).collect();
                    format!("LUN {sign}{}", ids.join(","))
                })
            };
            what.extend(luns("+", &c.luns_added));
            what.extend(luns("-", &c.luns_removed));
            what.extend(luns("~", &c.luns_replaced));
            if c.alias {
                what.push("alias".into());
            }
            if c.access {
                what.push("access rules".into());
            }
            done.push(format!("target {}: {}", c.iqn, what.join(", ")));
        }
        if self.discovery {
            done.push("discovery CHAP".into());
        }
        let mut line = if done.is_empty() {
            "no change to the targets".to_string()
        } else {
            done.join("; ")
        };
        if !self.needs_restart.is_empty() {
            line.push_str(&format!(
                "; changed but kept until a restart: {}",
                self.needs_restart.join(", ")
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, "r.toml").unwrap()
    }

    const BASE: &str = "portals = [\"127.0.0.1:3260\"]\n\
        [[target]]\niqn = \"iqn.2026-11.org.reservoir:a\"\nalias = \"a\"\n\
        [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n\
        [[target.lun]]\nid = 1\nstore = \"ram:?size=1MiB\"\n\
        [[target]]\niqn = \"iqn.2026-11.org.reservoir:b\"\n\
        [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n";

    #[test]
    fn the_same_configuration_changes_nothing() {
        let p = plan(&config(BASE), &config(BASE)).unwrap();
        assert!(p.added.is_empty() && p.removed.is_empty() && p.changed.is_empty());
        assert!(p.needs_restart.is_empty() && !p.discovery);
        assert_eq!(p.summary(), "no change to the targets");
    }

    #[test]
    fn targets_luns_aliases_and_access_rules_are_told_apart() {
        let new = config(
            "portals = [\"127.0.0.1:3260\"]\n\
             [discovery]\nchap = { user = \"d\", secret = \"discsecret12\" }\n\
             [[target]]\niqn = \"IQN.2026-11.org.reservoir:A\"\nalias = \"renamed\"\n\
             allowed_initiators = [\"iqn.2026-11.org.example:h\"]\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=2MiB\"\n\
             [[target.lun]]\nid = 2\nstore = \"ram:?size=1MiB\"\n\
             [[target]]\niqn = \"iqn.2026-11.org.reservoir:c\"\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n",
        );
        let p = plan(&config(BASE), &new).unwrap();
        assert_eq!(p.added, ["iqn.2026-11.org.reservoir:c"]);
        assert_eq!(p.removed, ["iqn.2026-11.org.reservoir:b"]);
        assert_eq!(
            p.changed,
            [TargetChange {
                iqn: "IQN.2026-11.org.reservoir:A".into(),
                luns_added: vec![2],
                luns_removed: vec![1],
                luns_replaced: vec![0],
                alias: true,
                access: true,
            }]
        );
        assert!(!p.changed[0].keeps(0) && !p.changed[0].keeps(2));
        assert!(p.discovery && p.needs_restart.is_empty());
        assert_eq!(p.config.targets, new.targets);
        assert_eq!(
            p.summary(),
            "target iqn.2026-11.org.reservoir:c added; target iqn.2026-11.org.reservoir:b \
             removed; target IQN.2026-11.org.reservoir:A: LUN +2, LUN -1, LUN ~0, alias, \
             access rules; discovery CHAP"
        );
    }

    #[test]
    fn what_needs_a_restart_is_kept_and_named() {
        let new = config(
            "portals = [\"127.0.0.1:3261\"]\nportal_group = 2\n\
             [session]\nqueue_depth = 8\n[isns]\nserver = \"10.0.0.1\"\n\
             [[target]]\niqn = \"iqn.2026-11.org.reservoir:a\"\nalias = \"a\"\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n\
             [[target.lun]]\nid = 1\nstore = \"ram:?size=1MiB\"\n\
             [[target]]\niqn = \"iqn.2026-11.org.reservoir:b\"\n\
             [[target.lun]]\nid = 0\nstore = \"ram:?size=1MiB\"\n",
        );
        let old = config(BASE);
        let p = plan(&old, &new).unwrap();
        assert_eq!(
            p.needs_restart,
            ["portals", "[session]", "[isns]", "portal_group"]
        );
        assert_eq!(p.config.portals, old.portals);
        assert_eq!(p.config.session, old.session);
        assert_eq!((&p.config.isns, p.config.portal_group), (&None, 1));
        assert_eq!(
            p.summary(),
            "no change to the targets; changed but kept until a restart: portals, \
             [session], [isns], portal_group"
        );
    }

    #[test]
    fn a_reload_that_cannot_stand_beside_what_stays_is_refused() {
        // The target names a portal that only a restart would listen on.
        let new = config(
            "portals = [\"127.0.0.1:3261\"]\n\
             [[target]]\niqn = \"iqn.2026-11.org.reservoir:a\"\nportals = [\"127.0.0.1:3261\"]\n",
        );
        let e = plan(&config(BASE), &new).unwrap_err();
        assert!(e.contains("not one of the portals listened on"), "{e}");
        // A change-tracked LUN's settings.
        let tracked = |size: &str| {
            config(&format!(
                "[[target]]\niqn = \"iqn.2026-11.org.reservoir:a\"\n[[target.lun]]\nid = 3\n\
                 store = \"ram:?size={size}\"\ntrack = true\ntrack_file = \"a.changes\"\n"
            ))
        };
        let e = plan(&tracked("1MiB"), &tracked("2MiB")).unwrap_err();
        assert!(e.contains("LUN 3") && e.contains("restart"), "{e}");
        assert!(plan(&tracked("1MiB"), &tracked("1MiB")).is_ok());
    }
}
