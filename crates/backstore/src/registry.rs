//! Opening stores by kind: a [`StoreFactory`] per kind, a [`Registry`] of them, and the
//! [`OpenContext`] through which a store built on others opens its members.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::spec::{SpecError, StoreSpec};
use crate::Backstore;

/// One parameter a kind takes, for checking specs and for `--help`.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub name: &'static str,
    pub required: bool,
    pub help: &'static str,
}

/// Opens stores of one kind.
///
/// A kind built on other stores lists `members` among its [`params`](Self::params) and
/// opens each through [`OpenContext::open`], so members can be of any registered kind.
/// Before `check` or `open` is called the registry has made sure the spec has only the
/// listed parameters, every required one, and members only if the kind takes them.
pub trait StoreFactory: Send + Sync {
    /// The kind as written in specs: `file` in `file:lun0.img`.
    fn kind(&self) -> &str;
    /// One line on what the store is.
    fn summary(&self) -> &str;
    fn params(&self) -> &[Param];
    /// What `open` would give, described for a person (`rsv target --check`), without
    /// creating or changing anything; errors where `open` surely would fail.
    fn check(&self, spec: &StoreSpec, ctx: &OpenContext<'_>) -> Result<String, OpenError>;
    /// The size in bytes `open` would give, for `--check`, or why it is not known before
    /// the store is opened. Creates and changes nothing (a remote store may log in).
    fn capacity(&self, _spec: &StoreSpec, _ctx: &OpenContext<'_>) -> Result<u64, String> {
        Err(format!(
            "a {} store's size is known when it is opened",
            self.kind()
        ))
    }
    fn open(
        &self,
        spec: &StoreSpec,
        ctx: &OpenContext<'_>,
    ) -> Result<Arc<dyn Backstore>, OpenError>;
}

/// Why a store could not be opened (or checked).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("store `{spec}`: no store kind {kind:?} is registered; known kinds: {known}")]
    UnknownKind {
        spec: String,
        kind: String,
        known: String,
    },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("store `{spec}`: {source}")]
    Io { spec: String, source: io::Error },
    #[error("store `{spec}`: {reason}")]
    Invalid { spec: String, reason: String },
}

impl OpenError {
    pub fn io(spec: &StoreSpec, source: io::Error) -> Self {
        OpenError::Io {
            spec: spec.shown(),
            source,
        }
    }

    pub fn invalid(spec: &StoreSpec, reason: impl Into<String>) -> Self {
        OpenError::Invalid {
            spec: spec.shown(),
            reason: reason.into(),
        }
    }
}

/// The store kinds a program knows, by name.
#[derive(Clone, Default)]
pub struct Registry {
    factories: BTreeMap<String, Arc<dyn StoreFactory>>,
}

impl Registry {
    /// A registry with no kinds at all.
    pub fn new() -> Self {
        Self::default()
    }

    /// The kinds this crate has: `file`, `null`, `ram` and `stripe`.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register(crate::file::FileFactory);
        r.register(crate::null::NULL);
        r.register(crate::ram::RAM);
        r.register(crate::stripe::StripeFactory);
        r
    }

    /// Adds a kind; one already registered under that name is replaced and returned.
    pub fn register(
        &mut self,
        factory: impl StoreFactory + 'static,
    ) -> Option<Arc<dyn StoreFactory>> {
        self.factories
            .insert(factory.kind().to_owned(), Arc::new(factory))
    }

    pub fn get(&self, kind: &str) -> Option<&dyn StoreFactory> {
        self.factories.get(kind).map(|f| &**f)
    }

    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Where to open stores from: relative paths are taken from `dir`.
    pub fn context<'a>(&'a self, dir: &'a Path) -> OpenContext<'a> {
        OpenContext {
            registry: self,
            dir,
            read_only: false,
            shared: false,
        }
    }

    /// Every kind with its parameters, for `--help` and the docs.
    pub fn help(&self) -> String {
        let mut out = String::from(
            "Store kinds (a LUN's `store`, as \"KIND:PATH?KEY=VALUE&...\" or a table; \
             PATH is the parameter `path`):\n",
        );
        for f in self.factories.values() {
            let _ = writeln!(out, "  {}: {}", f.kind(), f.summary());
            for p in f.params() {
                let need = if p.required { " (required)" } else { "" };
                let _ = writeln!(out, "      {}{need}: {}", p.name, p.help);
            }
        }
        out
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.kinds()).finish()
    }
}

/// How stores are being opened, handed to every factory and on to its members.
#[derive(Clone, Copy)]
pub struct OpenContext<'a> {
    registry: &'a Registry,
    dir: &'a Path,
    read_only: bool,
    shared: bool,
}

impl<'a> OpenContext<'a> {
    /// Stores opened to be read only: a factory opens its data so, and creates nothing.
    pub fn read_only(self, read_only: bool) -> Self {
        Self { read_only, ..self }
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Stores opened for a logical unit that other targets export too (multipath across
    /// targets): a factory whose store caches data in the process (librbd's cache) turns
    /// the cache off, or refuses, since the other targets' writes would not reach it.
    pub fn shared(self, shared: bool) -> Self {
        Self { shared, ..self }
    }

    pub fn is_shared(&self) -> bool {
        self.shared
    }

    pub fn registry(&self) -> &'a Registry {
        self.registry
    }

    /// A path from a spec, taken from the context's directory unless absolute.
    pub fn resolve(&self, path: &str) -> PathBuf {
        self.dir.join(path)
    }

    /// Opens `spec` with the factory of its kind.
    pub fn open(&self, spec: &StoreSpec) -> Result<Arc<dyn Backstore>, OpenError> {
        self.factory(spec)?.open(spec, self)
    }

    /// Checks and describes `spec` with the factory of its kind (see [`StoreFactory::check`]).
    pub fn check(&self, spec: &StoreSpec) -> Result<String, OpenError> {
        self.factory(spec)?.check(spec, self)
    }

    /// The size `spec` would have, or why that is not known yet (see
    /// [`StoreFactory::capacity`]).
    pub fn capacity(&self, spec: &StoreSpec) -> Result<u64, String> {
        self.factory(spec)
            .map_err(|e| e.to_string())?
            .capacity(spec, self)
    }

    fn factory(&self, spec: &StoreSpec) -> Result<&'a dyn StoreFactory, OpenError> {
        let Some(f) = self.registry.get(spec.kind()) else {
            return Err(OpenError::UnknownKind {
                spec: spec.shown(),
                kind: spec.kind().into(),
                known: self.registry.kinds().collect::<Vec<_>>().join(", "),
            });
        };
        let params = f.params();
        let takes = |name: &str| params.iter().any(|p| p.name == name);
        let unknown = spec
            .params()
            .keys()
            .map(String::as_str)
            .chain((!spec.members().is_empty()).then_some("members"))
            .find(|k| !takes(k));
        if let Some(key) = unknown {
            let known: Vec<&str> = params.iter().map(|p| p.name).collect();
            return Err(SpecError::UnknownParam {
                spec: spec.shown(),
                kind: spec.kind().into(),
                key: key.into(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            }
            .into());
        }
        let present = |name: &str| {
            spec.param(name).is_some() || (name == "members" && !spec.members().is_empty())
        };
        if let Some(p) = params.iter().find(|p| p.required && !present(p.name)) {
            return Err(SpecError::MissingParam {
                spec: spec.shown(),
                kind: spec.kind().into(),
                key: p.name.into(),
                help: format!(": {}", p.help),
            }
            .into());
        }
        Ok(f)
    }
}
