//! The factory of a store kind whose one parameter is its size (`ram:?size=…`,
//! `null:?size=…`): the parameter, its check and the capacity it gives are the same for
//! each such kind, which differs only in its name, its words and the store it opens.

use std::sync::Arc;

use crate::{Backstore, OpenContext, OpenError, Param, StoreFactory, StoreSpec};
use units::Size;

/// `KIND:?size=SIZE`: a store of SIZE bytes made by `open`.
pub(crate) struct SizedFactory {
    pub kind: &'static str,
    /// What `rsv target --help` says of the kind.
    pub summary: &'static str,
    /// What `--check` adds after the size, in brackets.
    pub note: &'static str,
    pub open: fn(u64) -> Arc<dyn Backstore>,
}

impl SizedFactory {
    /// The `size` parameter, which the spec must give.
    fn size(spec: &StoreSpec) -> Result<u64, OpenError> {
        spec.size("size")?
            .ok_or_else(|| spec.missing("size").into())
    }
}

impl StoreFactory for SizedFactory {
    fn kind(&self) -> &str {
        self.kind
    }

    fn summary(&self) -> &str {
        self.summary
    }

    fn params(&self) -> &[Param] {
        &[Param {
            name: "size",
            required: true,
            help: "1GiB or 1G (binary), 1GB (decimal) or bytes",
        }]
    }

    fn check(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<String, OpenError> {
        let size = Self::size(spec)?;
        Ok(format!("{}, {} ({})", self.kind, Size(size), self.note))
    }

    fn capacity(&self, spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<u64, String> {
        Self::size(spec).map_err(|e| e.to_string())
    }

    fn open(
        &self,
        spec: &StoreSpec,
        _ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError> {
        Ok((self.open)(Self::size(spec)?))
    }
}
