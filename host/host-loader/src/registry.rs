//! Discovery and checks. Every refusal is one line naming the plugin folder
//! and, where versions are involved, both sides' versions. One plugin's
//! failure never stops the others. A library, once opened, stays mapped
//! until the process ends, whether it was admitted or refused
//! ([`map_for_process_lifetime`]).

use crate::toml_manifest::TomlManifest;
use abi_stable::library::{lib_header_from_path, LibraryError};
use plugin_api::{HostInfo, PluginKind, PluginManifest, PluginRoot_Ref, ABI_VERSION};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A plugin that passed every check.
pub struct LoadedPlugin {
    pub dir: PathBuf,
    pub manifest: PluginManifest,
    pub root: PluginRoot_Ref,
}

impl LoadedPlugin {
    pub fn name(&self) -> &str {
        self.manifest.name.as_str()
    }
    pub fn kind(&self) -> PluginKind {
        self.manifest.kind
    }
    pub fn has_capability(&self, tag: &str) -> bool {
        self.manifest.capabilities.iter().any(|c| c.as_str() == tag)
    }
}

/// A plugin folder that was refused, and why.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub dir: PathBuf,
    pub name: Option<String>,
    pub reason: String,
}

#[derive(Default)]
pub struct Registry {
    pub plugins: Vec<LoadedPlugin>,
    pub refused: Vec<Refusal>,
}

/// The plugins folder itself could not be read (a plugin that cannot be
/// loaded is a [`Refusal`], not an error).
#[derive(Debug, thiserror::Error)]
#[error("cannot read plugins folder {}: {source}", dir.display())]
pub struct DiscoverError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl Registry {
    /// Scans `dir` for sub-folders holding a `plugin.toml`, in name order.
    pub fn discover(dir: &Path, host: &HostInfo) -> Result<Self, DiscoverError> {
        let entries = std::fs::read_dir(dir).map_err(|source| DiscoverError { dir: dir.to_path_buf(), source })?;
        let mut folders: Vec<PathBuf> =
            entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("plugin.toml").exists()).collect();
        folders.sort();
        let mut reg = Registry::default();
        for folder in folders {
            match load_one(&folder, host) {
                Ok(p) => reg.admit(p),
                Err((name, reason)) => reg.refused.push(Refusal { dir: folder, name, reason }),
            }
        }
        Ok(reg)
    }

    /// Adds a checked plugin unless its name or one of its claims is taken.
    fn admit(&mut self, p: LoadedPlugin) {
        if let Some(other) = self.plugins.iter().find(|o| o.name() == p.name()) {
            let reason = format!("duplicate plugin name `{}` (already loaded from {})", p.name(), other.dir.display());
            self.refused.push(Refusal { dir: p.dir.clone(), name: Some(p.name().to_owned()), reason });
            return;
        }
        for (what, mine) in claim_keys(&p) {
            if let Some(owner) =
                self.plugins.iter().find(|o| claim_keys(o).iter().any(|(w, c)| *w == what && *c == mine))
            {
                let reason = format!("duplicate claim: {what} `{mine}` is already claimed by `{}`", owner.name());
                self.refused.push(Refusal { dir: p.dir.clone(), name: Some(p.name().to_owned()), reason });
                return;
            }
        }
        self.plugins.push(p);
    }

    pub fn of_kind(&self, kind: PluginKind) -> impl Iterator<Item = &LoadedPlugin> {
        self.plugins.iter().filter(move |p| p.kind() == kind)
    }

    pub fn by_name(&self, name: &str) -> Option<&LoadedPlugin> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// The sorted claims table: (what, claim) → plugin name.
    pub fn claims(&self) -> BTreeMap<(String, String), String> {
        let mut t = BTreeMap::new();
        for p in &self.plugins {
            for (what, c) in claim_keys(p) {
                t.insert((what.to_owned(), c), p.name().to_owned());
            }
        }
        t
    }
}

/// The claims that must be unique across plugins. Cache layouts may share
/// needs and schemes (the host picks by capability), so only model types,
/// architectures and draft kinds are exclusive.
fn claim_keys(p: &LoadedPlugin) -> Vec<(&'static str, String)> {
    let c = &p.manifest.claims;
    let mut v = Vec::new();
    v.extend(c.model_types.iter().map(|s| ("model_type", s.to_string())));
    v.extend(c.architectures.iter().map(|s| ("architecture", s.to_string())));
    v.extend(c.draft_kinds.iter().map(|s| ("draft kind", s.to_string())));
    v
}

type LoadError = (Option<String>, String);

fn load_one(folder: &Path, host: &HostInfo) -> Result<LoadedPlugin, LoadError> {
    let toml = TomlManifest::read(&folder.join("plugin.toml")).map_err(|e| (None, e.to_string()))?;
    let name = Some(toml.name.clone());
    let fail = |reason: String| (name.clone(), reason);
    if toml.abi_version != ABI_VERSION {
        return Err(fail(format!("built for plugin ABI v{}; this host speaks v{ABI_VERSION}", toml.abi_version)));
    }
    let kind = PluginKind::parse(&toml.kind)
        .ok_or_else(|| fail(format!("unknown plugin kind `{}` in plugin.toml", toml.kind)))?;
    let lib = folder.join(&toml.library);
    if !lib.exists() {
        return Err(fail(format!(
            "library {} is missing: build the plugin and put its library beside plugin.toml (in-tree plugins: `cargo xtask build`)",
            lib.display()
        )));
    }
    map_for_process_lifetime(&lib).map_err(fail)?;
    let header = lib_header_from_path(&lib).map_err(|e| fail(describe(&e)))?;
    let root: PluginRoot_Ref = header.init_root_module().map_err(|e| fail(describe(&e)))?;
    if root.abi_version() != ABI_VERSION {
        return Err(fail(format!(
            "library built for plugin ABI v{}; this host speaks v{ABI_VERSION}",
            root.abi_version()
        )));
    }
    let manifest = (root.manifest())().into_result().map_err(|e| fail(format!("manifest() failed: {e}")))?;
    let mismatch = |what: &str, lib: &str, file: &str| {
        fail(format!("identity mismatch: library says {what} `{lib}`, plugin.toml says `{file}`"))
    };
    if manifest.name.as_str() != toml.name {
        return Err(mismatch("name", &manifest.name, &toml.name));
    }
    if manifest.version.as_str() != toml.version {
        return Err(mismatch("version", &manifest.version, &toml.version));
    }
    if manifest.kind != kind {
        return Err(mismatch("kind", manifest.kind.as_str(), &toml.kind));
    }
    if manifest.abi_version != ABI_VERSION {
        return Err(fail(format!(
            "manifest declares plugin ABI v{}; this host speaks v{ABI_VERSION}",
            manifest.abi_version
        )));
    }
    (root.init())(host).into_result().map_err(|e| fail(format!("init failed: {e}")))?;
    Ok(LoadedPlugin { dir: folder.to_path_buf(), manifest, root })
}

/// Opens `lib` so that it is never unmapped, before any of its code runs.
///
/// Everything a plugin makes keeps pointers into its library: the vtables of
/// the `RString`s and `RVec`s in its manifest and errors, of every trait
/// object (graphs, caches, drafters), its thread-local destructors (run when
/// a thread, or the process, ends) and the error handler its mlx-rs copy
/// registers inside libmlxc on its first MLX call, which libmlxc keeps for
/// the life of the process. Unmapping the library while any of them lives
/// sends the next call into whatever is mapped there next. So the handle is
/// leaked on purpose, and RTLD_NODELETE makes any later `dlclose` of the
/// object a no-op, even one that drops the last handle: abi_stable closes
/// its own handle when a library turns out not to be a plugin, after the
/// library's initialisers (and whatever they registered) already ran. A
/// refused plugin stays mapped too: its `manifest()` or `init()` may have
/// run. Its error is a refusal's reason.
fn map_for_process_lifetime(lib: &Path) -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: opening runs the library's initialisers; a plugin folder is
    // trusted code, as it is for abi_stable's own open below.
    let handle = unsafe { Library::open(Some(lib), RTLD_NOW | RTLD_LOCAL | libc::RTLD_NODELETE) }
        .map_err(|e| format!("cannot open {}: {e}", lib.display()))?;
    std::mem::forget(handle);
    Ok(())
}

/// One line for abi_stable's load errors.
fn describe(e: &LibraryError) -> String {
    match e {
        LibraryError::OpenError { path, err } => format!("cannot open {}: {err}", path.display()),
        LibraryError::GetSymbolError { .. } => "not a plugin: no root module exported (was it built with plugin_sdk::export_plugin!?)".to_owned(),
        LibraryError::IncompatibleVersionNumber { library_name, expected_version, actual_version } => format!(
            "{library_name}: built against plugin-api {actual_version}, which this host (plugin-api {expected_version}) cannot load"
        ),
        LibraryError::AbiInstability(err) => format!(
            "ABI layout mismatch: the plugin's boundary types differ from this host's plugin-api {}{}",
            plugin_api_version(),
            layout_differences(&err.to_string())
        ),
        LibraryError::RootModule { err, .. } => format!("the root module failed to initialise: {err}"),
        other => other.to_string().lines().next().unwrap_or("load error").to_owned(),
    }
}

/// The gist of abi_stable's (many-line) layout report, as ` (in `T`: what:
/// expected `a`, found `b`; ...)`: the innermost type compared and its first
/// two differences. Empty when the report has no `Error:` entries.
fn layout_differences(report: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    // The first non-empty line after `lines[i]`, without its field label.
    let value_after = |i: usize| {
        let v = lines[i + 1..].iter().map(|l| l.trim()).find(|l| !l.is_empty()).unwrap_or("");
        v.strip_prefix("field_name:").unwrap_or(v).to_owned()
    };
    let mut diffs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(what) = line.strip_prefix("Error:") else { continue };
        let end = lines[i + 1..].iter().position(|l| l.starts_with("Error:")).map_or(lines.len(), |n| i + 1 + n);
        let label = |name: &str| lines[i..end].iter().position(|l| l.trim() == name).map(|j| value_after(i + j));
        let (expected, found) = (label("Expected:"), label("Found:"));
        diffs.push(match (expected, found) {
            (Some(e), Some(f)) => format!("{}: expected `{e}`, found `{f}`", what.trim()),
            _ => what.trim().to_owned(),
        });
    }
    if diffs.is_empty() {
        return String::new();
    }
    let inside = lines
        .iter()
        .position(|l| l.trim() == "Layout of expected type:")
        .and_then(|i| lines[i..].iter().find_map(|l| l.trim().strip_prefix("type:")))
        .map(|t| format!("in `{t}`: "))
        .unwrap_or_default();
    let more = if diffs.len() > 2 { format!("; {} more", diffs.len() - 2) } else { String::new() };
    diffs.truncate(2);
    format!(" ({inside}{}{more})", diffs.join("; "))
}

/// The plugin-api version this host was compiled against.
pub fn plugin_api_version() -> &'static str {
    use abi_stable::library::RootModule;
    PluginRoot_Ref::VERSION_STRINGS.version.as_str()
}
