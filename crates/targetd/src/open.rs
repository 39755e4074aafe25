//! Opening a target node from its configuration: each LUN's store (by the registry's
//! kinds), its change map, and its logical unit; at start, and for what a configuration
//! reload adds or changes (the LUs it keeps are handed in and reused as they are).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use backstore::{
    Backstore, ChangeMap, Hold, ImageOptions, Imaged, NewMap, Registry, SidePlace, Tracked, Undo,
};
use scsi::{LogicalUnit, LuConfig};
use tracing::info;

use crate::config::{Config, LunConfig, TargetConfig};
use crate::node::{LunStore, TargetNode};

/// A LUN a reload keeps as it runs: its unit and its store.
pub(crate) type Kept = BTreeMap<u16, (Arc<LogicalUnit>, LunStore)>;

/// A stable 64-bit id for names (FNV-1a): LU designators must not change across restarts.
fn stable_id(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Opens LUN `l`'s change map: `track_file`, or the store's `.changes` file beside its
/// data; `taken` holds the other LUNs' maps. A map that is new, or that cannot be trusted as found, counts every unit as
/// changed: the store's history is unknown to it.
fn open_changes(
    at: &str,
    l: &LunConfig,
    data_dir: &std::path::Path,
    store: &Arc<dyn Backstore>,
    taken: &mut std::collections::HashSet<std::path::PathBuf>,
) -> anyhow::Result<Arc<ChangeMap>> {
    let path = match &l.track_file {
        Some(f) => data_dir.join(f),
        None => store.sidecar(".changes").ok_or_else(|| {
            anyhow!(
                "{at}: track = true, but its store ({}) has no place for the change map \
                 beside its data: give one with track_file = \"PATH\"",
                store.description()
            )
        })?,
    };
    // Two maps in one file would each rename the other's away.
    if !taken.insert(path.clone()) {
        bail!(
            "{at}: its change map {} is another LUN's too",
            path.display()
        );
    }
    let map = ChangeMap::open(&path, store.size(), l.track_unit(), NewMap::AllDirty)
        .with_context(|| format!("{at}: opening its change map"))?;
    info!(
        "{at}: changes tracked in {} ({} dirty{})",
        path.display(),
        units::Size(map.dirty_bytes()),
        map.frozen_id()
            .map(|id| format!(", frozen set {id} not released"))
            .unwrap_or_default()
    );
    Ok(Arc::new(map))
}

/// A file of the LUN's beside its data (`store.sidecar`), or in the data directory for
/// a store with no place beside it (a stripe, a RAM or remote store), named after the LUN.
fn beside(
    iqn: &str,
    lun: u16,
    store: &Arc<dyn Backstore>,
    data_dir: &std::path::Path,
    suffix: &str,
) -> PathBuf {
    store.sidecar(suffix).unwrap_or_else(|| {
        let name: String = format!("{iqn}-lun{lun}{suffix}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        data_dir.join(name)
    })
}

/// Where a LUN's point-in-time images keep what writes overwrite: memory for a RAM store
/// (a quarter of its size at most), else a sparse file beside its data (or in the data
/// directory, for a store with no place beside it) as large as the store.
fn image_options(
    iqn: &str,
    lun: u16,
    spec: &backstore::StoreSpec,
    store: &Arc<dyn Backstore>,
    data_dir: &std::path::Path,
) -> ImageOptions {
    let size = store.size();
    let (side, limit) = if spec.kind() == "ram" {
        (SidePlace::Memory, size / 4)
    } else {
        (
            SidePlace::File(beside(iqn, lun, store, data_dir, ".image")),
            size,
        )
    };
    ImageOptions {
        side,
        unit: backstore::image::DEFAULT_UNIT,
        limit,
    }
}

/// LUN `l`'s undo layer (`undo = true`), outermost: every change reaches it first. Its
/// log is `undo_file`, else the store's `.undo` file beside its data, else a file in the
/// data directory; memory for a RAM store (whose data a restart loses anyway). A cycle
/// found open is rolled back here, before the LUN serves anything; a roll back marks the
/// units it restores in the LUN's change map (`changes`), so that they count as changed
/// since the last image both sites hold.
#[allow(clippy::too_many_arguments)]
fn open_undo(
    at: &str,
    iqn: &str,
    l: &LunConfig,
    spec: &backstore::StoreSpec,
    raw: &Arc<dyn Backstore>,
    store: Arc<dyn Backstore>,
    changes: Option<Arc<backstore::ChangeMap>>,
    data_dir: &std::path::Path,
) -> anyhow::Result<Arc<Undo>> {
    let unit = backstore::undo::DEFAULT_UNIT;
    if spec.kind() == "ram" && l.undo_file.is_none() {
        return Ok(Arc::new(Undo::open_with(
            store,
            Box::<backstore::undo::MemLog>::default(),
            unit,
            changes,
        )?));
    }
    let path = match &l.undo_file {
        Some(f) => data_dir.join(f),
        None => raw
            .sidecar(".undo")
            .unwrap_or_else(|| data_dir.join(side_name(iqn, l.id, "undo"))),
    };
    let undo = Undo::open_file_with(store, &path, unit, changes)
        .with_context(|| format!("{at}: its undo log {}", path.display()))?;
    if let Some((cycle, _)) = undo.state().committed {
        info!(
            "{at}: holds the image of cycle {cycle} ({})",
            path.display()
        );
    }
    Ok(Arc::new(undo))
}

/// A file name for LUN `lun` of `iqn` in the data directory.
fn side_name(iqn: &str, lun: u16, ext: &str) -> String {
    format!("{iqn}-lun{lun}.{ext}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The node of target `t`: LUNs in `keep` reused, every other one opened; `taken` holds
/// the change maps of the LUNs opened or kept so far.
pub(crate) fn open_target(
    t: &TargetConfig,
    config: &Config,
    stores: &Registry,
    taken: &mut HashSet<PathBuf>,
    keep: &Kept,
) -> anyhow::Result<TargetNode> {
    let opener = stores.context(&config.data_dir);
    let mut luns = BTreeMap::new();
    let mut lun_stores = BTreeMap::new();
    for l in &t.luns {
        if let Some((lu, store)) = keep.get(&l.id) {
            if let Some(map) = &store.changes {
                taken.insert(map.path().to_path_buf());
            }
            luns.insert(l.id, lu.clone());
            lun_stores.insert(l.id, store.clone());
            continue;
        }
        let at = format!("target {} LUN {}", t.iqn, l.id);
        let spec = l.store_spec(stores).map_err(|e| anyhow!("{at}: {e}"))?;
        let store = opener
            .read_only(l.read_only)
            .shared(config.multipath())
            .open(&spec)
            .with_context(|| format!("opening {at}"))?;
        if store.size() % l.block_size as u64 != 0 || store.size() == 0 {
            bail!(
                "{at}: {}: size {} is not a positive multiple of the block size {}",
                store.description(),
                store.size(),
                l.block_size
            );
        }
        let raw = store.clone();
        let changes = l
            .track
            .then(|| open_changes(&at, l, &config.data_dir, &store, taken))
            .transpose()?;
        let store: Arc<dyn Backstore> = match &changes {
            Some(map) => Arc::new(Tracked::new(store, map.clone())?),
            None => store,
        };
        // Outside change tracking, so that an image's cut and a change map's freeze can be one moment
        // (the agent freezes at the cut).
        let imaged = Arc::new(Imaged::new(
            store,
            image_options(&t.iqn, l.id, &spec, &raw, &config.data_dir),
        )?);
        let store: Arc<dyn Backstore> = imaged.clone();
        // A replica of `rsv sync` comes back fenced: only its replication streams write.
        // A record that cannot be read keeps the LUN closed rather than writable.
        let role_file = beside(&t.iqn, l.id, &raw, &config.data_dir, ".role");
        let role = backstore::role::RoleRecord::load(&role_file)
            .with_context(|| format!("{at}: its replication role"))?;
        let undo = l
            .undo
            .then(|| {
                open_undo(
                    &at,
                    &t.iqn,
                    l,
                    &spec,
                    &raw,
                    store.clone(),
                    changes.clone(),
                    &config.data_dir,
                )
            })
            .transpose()?;
        let store: Arc<dyn Backstore> = match &undo {
            Some(u) => u.clone(),
            None => store,
        };
        lun_stores.insert(
            l.id,
            LunStore {
                store: raw,
                changes,
                spec: spec.shown(),
                stats: config.metrics.is_some().then(Default::default),
                imaged,
                hold: Arc::new(Hold::default()),
                role_file: Some(role_file),
                undo,
            },
        );
        let description = store.description();
        // Reservations made with APTPL live where the store keeps state beside its
        // data; a store without such a place cannot keep them.
        let pr_file = store.sidecar(".pr");
        let id = stable_id(&[&t.iqn.to_ascii_lowercase(), &l.id.to_string()]);
        // NAA 6 with an IEEE company id of zero and our hash as the vendor part.
        let naa_id = 0x6000_0000_0000_0000 | (id >> 4);
        let serial = l.serial.clone().unwrap_or_else(|| format!("{:016x}", id));
        let lu = LogicalUnit::new(
            LuConfig {
                block_size: l.block_size,
                physical_block_exponent: l.physical_block_exponent,
                read_only: l.read_only,
                removable: l.removable,
                thin: l.thin && store.supports_discard(),
                serial: serial.clone(),
                naa_id,
                device_id: format!("{}-lun{}", t.iqn, l.id),
                pr_file,
                target_name: t.iqn.clone(),
                // Every portal is in the one portal group (`portal_group`), so
                // the target has one target port, reachable by all portals; its
                // relative id is the group's, as for the peers' ports.
                target_port_group: config.portal_group,
                relative_port: config.portal_group,
                peer_port_groups: config.peer_portal_groups.clone(),
                sanitize_rate: l.sanitize_rate,
                ..LuConfig::default()
            },
            store,
        );
        info!(
            "{at}: {} blocks of {} bytes{} on {description}",
            lu.capacity_blocks(),
            l.block_size,
            if l.read_only { ", read-only" } else { "" }
        );
        if let Some(r) = &role {
            info!("{at}: {} of rsv sync at epoch {}", r.role.as_str(), r.epoch);
            lu.fence().set(r.fence());
        }
        // A LUN with an undo log is written by syncs in cycles: its fence admits a stream
        // only in the cycle the stream names (no cycle is open at start: the undo layer
        // rolled back any it found).
        lu.fence()
            .keep_cycles(lun_stores.get(&l.id).is_some_and(|s| s.undo.is_some()));
        let lu = Arc::new(lu);
        lu.listen_to_peers();
        // A gateway group's ALUA states, where the store keeps them in its cluster.
        lu.follow_port_groups()
            .with_context(|| format!("{at}: the target port groups' states"))?;
        luns.insert(l.id, lu);
    }
    Ok(TargetNode {
        iqn: t.iqn.clone(),
        alias: t.alias.clone(),
        allowed_initiators: t.allowed_initiators.clone(),
        require_tls: t.require_tls,
        portals: t.portals.clone(),
        require_chap: t.require_chap,
        initiators: t.initiators.clone(),
        chap: t.chap.clone(),
        luns,
        stores: lun_stores,
    })
}
