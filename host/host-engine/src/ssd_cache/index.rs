//! What the cache directory holds for this engine's namespace, in memory:
//! each entry's name, tokens, size and last use (its file's mtime, which a
//! hit refreshes, so the LRU order survives a restart). Built at start by
//! reading only the headers; kept in step with every write, hit, eviction
//! and rejection. Files of other namespaces are left alone and not
//! counted against the cap.

use super::format;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub struct DiskEntry {
    pub name: String,
    pub tokens: Vec<u32>,
    pub trimmable: bool,
    pub bytes: u64,
    pub used: SystemTime,
}

pub struct Index {
    dir: PathBuf,
    cap: u64,
    entries: Vec<DiskEntry>,
}

/// What the start-up scan found besides usable entries.
#[derive(Default, Debug)]
pub struct ScanReport {
    /// Entry-named files that are corrupt, truncated, foreign or of another namespace.
    pub rejected: u64,
    /// Leftover temp files of interrupted writes, removed.
    pub temps_removed: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Index {
    /// Scans `dir` (created if missing): removes temp files, indexes the
    /// entries of namespace `ns`, then evicts down to `cap` bytes.
    pub fn scan(dir: &Path, ns: &str, cap: u64) -> std::io::Result<(Self, ScanReport)> {
        // Private to the user when this creates it (the files hold prompts' state).
        let mut builder = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(builder.recursive(true), 0o700);
        builder.create(dir)?;
        let mut report = ScanReport::default();
        let mut entries = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let Ok(item) = item else { continue };
            let path = item.path();
            let Some(file) = path.file_name().and_then(|f| f.to_str()) else { continue };
            let Some((stem, ext)) = file.split_once('.') else { continue };
            if !format::is_entry_stem(stem) || !item.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if ext == format::TMP_EXT {
                if std::fs::remove_file(&path).is_ok() {
                    report.temps_removed += 1;
                }
                continue;
            }
            if ext != format::EXT {
                continue;
            }
            match read_one(&path, stem) {
                Ok((h, bytes, used)) if h.namespace == ns => entries.push(DiskEntry {
                    name: stem.to_owned(),
                    tokens: h.tokens,
                    trimmable: h.trimmable,
                    bytes,
                    used,
                }),
                Ok(_) => report.rejected += 1,
                Err(e) => {
                    tracing::warn!("ssd cache: skipping {}: {e}", path.display());
                    report.rejected += 1;
                }
            }
        }
        let mut index = Self { dir: dir.to_path_buf(), cap, entries };
        index.evict_to(cap);
        Ok((index, report))
    }

    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    pub fn count(&self) -> usize {
        self.entries.len()
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.name == name)
    }

    /// The entry sharing the longest prefix with `usable`, longer than
    /// `floor` tokens, that can be used at that length (it is exactly that
    /// long or it could be trimmed) and is at most `max_bytes` large:
    /// (name, shared tokens).
    pub fn best(&self, usable: &[u32], floor: usize, max_bytes: u64) -> Option<(String, usize)> {
        self.entries
            .iter()
            .filter(|e| e.bytes <= max_bytes)
            .map(|e| (e, common_prefix(&e.tokens, usable)))
            .filter(|&(e, k)| k > floor && (k == e.tokens.len() || e.trimmable))
            .max_by_key(|&(e, k)| (k, std::cmp::Reverse(e.tokens.len() - k)))
            .map(|(e, k)| (e.name.clone(), k))
    }

    /// Records a hit: the entry becomes the most recently used (its
    /// file's mtime too, for the order after a restart).
    pub fn touch(&mut self, name: &str) {
        let now = SystemTime::now();
        if let Some(e) = self.entries.iter_mut().find(|e| e.name == name) {
            e.used = now;
            let path = self.path(name);
            if let Ok(f) = std::fs::File::open(path) {
                let _ = f.set_modified(now);
            }
        }
    }

    /// Records a written entry; a trimmable one supersedes the stored
    /// entries that are prefixes of it (their files are deleted). Returns
    /// how many entries the cap then evicted.
    pub fn add(&mut self, e: DiskEntry) -> u64 {
        let mut gone = Vec::new();
        if e.trimmable {
            for old in &self.entries {
                if old.tokens.len() < e.tokens.len() && e.tokens.starts_with(&old.tokens) {
                    gone.push(old.name.clone());
                }
            }
        }
        for name in &gone {
            self.remove(name);
        }
        self.entries.retain(|x| x.name != e.name);
        self.entries.push(e);
        self.evict_to(self.cap)
    }

    /// Forgets an entry and deletes its file.
    pub fn remove(&mut self, name: &str) {
        self.entries.retain(|e| e.name != name);
        let _ = std::fs::remove_file(self.path(name));
    }

    /// Deletes least recently used entries until at most `cap` bytes are
    /// held; returns how many.
    fn evict_to(&mut self, cap: u64) -> u64 {
        let mut n = 0;
        while self.bytes() > cap {
            let Some(oldest) = self.entries.iter().min_by_key(|e| e.used).map(|e| e.name.clone()) else { break };
            self.remove(&oldest);
            n += 1;
        }
        n
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{}", format::EXT))
    }
}

/// The header, size and mtime of one entry file.
fn read_one(path: &Path, stem: &str) -> Result<(format::Header, u64, SystemTime), format::Reject> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path)?);
    let meta = f.get_ref().metadata()?;
    let h = format::read_header(&mut f, meta.len(), stem)?;
    Ok((h, meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(name: &str, tokens: &[u32], trimmable: bool, at: u64) -> DiskEntry {
        DiskEntry {
            name: name.to_owned(),
            tokens: tokens.to_vec(),
            trimmable,
            bytes: 100,
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
        }
    }

    fn names(i: &Index) -> Vec<&str> {
        let mut v: Vec<&str> = i.entries.iter().map(|e| e.name.as_str()).collect();
        v.sort();
        v
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ssd-index-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_cap_evicts_the_least_recently_used_and_a_read_counts_as_use() {
        let dir = scratch("lru");
        let mut i = Index { dir: dir.clone(), cap: 250, entries: Vec::new() };
        assert_eq!(i.add(entry("a", &[1, 2, 3], true, 1)), 0);
        assert_eq!(i.add(entry("b", &[4, 5], true, 2)), 0);
        i.touch("a");
        // c is newer than b, older than a's read: b goes.
        assert_eq!(i.add(entry("c", &[6], true, 3)), 1);
        assert_eq!(names(&i), ["a", "c"]);
        assert_eq!(i.bytes(), 200);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_trimmable_entry_supersedes_its_prefixes_and_an_untrimmable_one_does_not() {
        let dir = scratch("supersede");
        let mut i = Index { dir: dir.clone(), cap: 10_000, entries: Vec::new() };
        i.add(entry("short", &[1, 2], true, 1));
        i.add(entry("ring", &[1, 2, 3], false, 2));
        assert_eq!(names(&i), ["ring", "short"]);
        i.add(entry("long", &[1, 2, 3, 4], true, 3));
        assert_eq!(names(&i), ["long"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_best_entry_is_the_longest_usable_one_that_beats_ram_and_fits() {
        let dir = scratch("best");
        let mut i = Index { dir: dir.clone(), cap: 10_000, entries: Vec::new() };
        i.entries.push(entry("trim", &[1, 2, 3, 9, 9], true, 1));
        i.entries.push(entry("exact", &[1, 2], false, 1));
        i.entries.push(entry("ring", &[1, 2, 3, 4, 8], false, 1));
        let prompt = [1, 2, 3, 4, 5];
        // The ring shares 4 tokens but cannot be cut down to them.
        assert_eq!(i.best(&prompt, 0, 1000), Some(("trim".to_owned(), 3)));
        assert_eq!(i.best(&prompt, 3, 1000), None, "RAM already holds 3 tokens");
        // At equal length, the entry that needs no trim.
        assert_eq!(i.best(&[1, 2, 7], 0, 1000), Some(("exact".to_owned(), 2)));
        assert_eq!(i.best(&prompt, 0, 99), None, "larger than the RAM tier can hold");
        i.entries.retain(|e| e.name != "trim");
        assert_eq!(i.best(&prompt, 0, 1000), Some(("exact".to_owned(), 2)));
        let _ = std::fs::remove_dir_all(dir);
    }
}
