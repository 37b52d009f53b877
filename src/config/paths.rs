//! The path keys: `~` expansion, resolution against a base directory, and the relative
//! paths a run records so that its directory can move.
use super::Config;
use std::path::{Path, PathBuf};

impl Config {
    /// `~/...` in the path keys as the shell would write it, from `HOME`: TOML does
    /// not expand it, and `output_dir = "~/runs"` made a directory named `~`.
    fn expand_home(&mut self) {
        let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
            return;
        };
        let expand = |p: &Path| -> Option<PathBuf> {
            let rest = p.strip_prefix("~").ok()?;
            Some(Path::new(&home).join(rest))
        };
        if let Some(p) = expand(&self.run.output_dir) {
            self.run.output_dir = p;
        }
        if let Some(p) = expand(Path::new(&self.model.name)) {
            self.model.name = p.display().to_string();
        }
        if let Some(p) = self.model.adapter.as_deref().and_then(expand) {
            self.model.adapter = Some(p);
        }
        if let Some(s) = self.sft.as_mut() {
            if let Some(p) = s.path.as_deref().and_then(expand) {
                s.path = Some(p);
            }
        }
    }

    /// Make the path keys absolute, resolved against the current directory (`base`):
    /// `run.output_dir` always, `model.name` when it names a local path (it exists, or
    /// `init_tiny` will create it, or it is written as a path) and not a Hub id or a
    /// `random:` shape. The run's config.toml then records where things are, so
    /// `train --resume RUN_DIR` works from any directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        self.expand_home();
        let abs = |p: &Path| -> PathBuf {
            let joined = if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            };
            lexical_normal(&std::path::absolute(&joined).unwrap_or(joined))
        };
        self.run.output_dir = abs(&self.run.output_dir);
        let name = self.model.name.trim();
        let p = Path::new(name);
        let local = !name.is_empty()
            && !name.starts_with("random:")
            && p.is_relative()
            && (base.join(p).exists()
                || self.model.init_tiny
                || matches!(
                    crate::model::load::ModelRef::parse(name),
                    Ok(crate::model::load::ModelRef::Local(_))
                ));
        if local {
            self.model.name = abs(p).display().to_string();
        }
        if let Some(a) = &self.model.adapter {
            self.model.adapter = Some(abs(a));
        }
        if let Some(p) = self.sft.as_mut().and_then(|s| s.path.as_mut()) {
            *p = abs(p);
        }
        self.map_env_paths(abs);
    }

    /// Apply `f` to every environment option that names a file (a dataset's `path`),
    /// in `[env.options]` and in each stage's `[stage.options.ENV]`.
    pub(super) fn map_env_paths(&mut self, f: impl Fn(&Path) -> PathBuf) {
        let fix = |name: &str, opts: &mut toml::Table| {
            for option in crate::envs::path_options(name) {
                // `key=default`: a default where the key's table is there without it
                let (key, default) = match option.split_once('=') {
                    Some((k, d)) => (k, Some(d)),
                    None => (*option, None),
                };
                // a dotted key names an option inside a table (`reward.dir`)
                let (parents, leaf) = match key.rsplit_once('.') {
                    Some((p, l)) => (Some(p), l),
                    None => (None, key),
                };
                let mut table = Some(&mut *opts);
                for part in parents.into_iter().flat_map(|p| p.split('.')) {
                    table = table
                        .and_then(|t| t.get_mut(part))
                        .and_then(|v| v.as_table_mut());
                }
                let Some(table) = table else { continue };
                if let (Some(d), false) = (default, table.contains_key(leaf)) {
                    table.insert(leaf.to_string(), toml::Value::String(d.to_string()));
                }
                if let Some(toml::Value::String(s)) = table.get_mut(leaf) {
                    *s = f(Path::new(s.as_str())).display().to_string();
                }
            }
        };
        if let Some(env) = self.env.as_mut() {
            fix(&env.name, &mut env.options);
        }
        for stage in &mut self.stages {
            for (name, opts) in &mut stage.options {
                fix(name, opts);
            }
        }
    }
}

/// `p` as the file system resolves it (absolute, symlinks followed), or lexically
/// absolute where it does not exist yet. A recorded `..` is then what the shell means by
/// it, whichever path (link or target) the run directory is reached by.
pub(super) fn real_path(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| {
        lexical_normal(&std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
    })
}

/// `p` without `.` components and with each `..` taking off the component before it
/// (a recorded `../../.models/m.gguf` read from `runs/NAME/` names `.models/m.gguf`).
fn lexical_normal(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            c => out.push(c.as_os_str()),
        }
    }
    out
}

/// `target` relative to `base` (both absolute): `None` when they share no root.
pub fn relative_path(target: &Path, base: &Path) -> Option<PathBuf> {
    use std::path::Component;
    if !target.is_absolute() || !base.is_absolute() {
        return None;
    }
    let t: Vec<Component> = target.components().collect();
    let b: Vec<Component> = base.components().collect();
    if t.first() != b.first() {
        return None;
    }
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PathsBase;

    #[test]
    fn recorded_paths_are_relative_to_the_run_directory_and_load_back() {
        let rel = |t: &str, b: &str| relative_path(Path::new(t), Path::new(b)).unwrap();
        assert_eq!(rel("/w/runs", "/w/runs/r"), PathBuf::from(".."));
        assert_eq!(
            rel("/w/.models/m.gguf", "/w/runs/r"),
            PathBuf::from("../../.models/m.gguf")
        );
        assert_eq!(rel("/w/runs/r/sft", "/w/runs/r"), PathBuf::from("sft"));
        assert_eq!(rel("/w/runs/r", "/w/runs/r"), PathBuf::from("."));
        assert!(relative_path(Path::new("runs"), Path::new("/w")).is_none());
        assert_eq!(
            lexical_normal(Path::new("/w/runs/r/../../.models/./m.gguf")),
            PathBuf::from("/w/.models/m.gguf")
        );
        // A run's config round-trips: written relative and marked, read back absolute.
        let d = tempfile::tempdir().unwrap();
        let base = std::path::absolute(d.path()).unwrap();
        std::fs::create_dir_all(base.join("m")).unwrap();
        let mut cfg = Config::from_toml_str(
            "[run]\nname = \"r\"\n[model]\nname = \"m\"\n[env]\nname = \"ticketmelt\"\n",
            "test",
            &[],
        )
        .unwrap();
        cfg.resolve_paths(&base);
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir).unwrap();
        let text = cfg.to_run_toml(&run_dir).unwrap();
        assert!(!text.contains(base.to_str().unwrap()), "{text}");
        assert!(
            text.contains("paths_relative_to = \"config_dir\""),
            "{text}"
        );
        std::fs::write(run_dir.join("config.toml"), &text).unwrap();
        let back = Config::load(&run_dir.join("config.toml"), &[]).unwrap();
        assert_eq!(back.run.output_dir, base.join("runs"));
        assert_eq!(back.model.name, base.join("m").display().to_string());
        assert_eq!(back.run.paths_relative_to, PathsBase::Cwd);
        assert_eq!(real_path(&back.run_dir()), real_path(&run_dir));
        // An override's path is the current directory's, not the run directory's.
        let set = ["model.adapter=elsewhere/a".to_string()];
        let back = Config::load(&run_dir.join("config.toml"), &set).unwrap();
        assert_eq!(
            back.model.adapter.as_deref(),
            Some(Path::new("elsewhere/a"))
        );
        assert_eq!(back.model.name, base.join("m").display().to_string());
    }

    /// A run directory reached through a symlink records paths that hold from its real
    /// location too (`..` is taken as the file system takes it).
    #[cfg(unix)]
    #[test]
    fn recorded_paths_hold_through_a_symlinked_run_directory() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("m")).unwrap();
        std::fs::create_dir_all(base.join("disk/deep/runs")).unwrap();
        std::os::unix::fs::symlink(base.join("disk/deep/runs"), base.join("runs")).unwrap();
        let text = "[run]\nname = \"r\"\n[model]\nname = \"m\"\n[env]\nname = \"ticketmelt\"\n";
        let mut cfg = Config::from_toml_str(text, "test", &[]).unwrap();
        cfg.resolve_paths(&base);
        let run_dir = cfg.run_dir();
        std::fs::create_dir_all(&run_dir).unwrap();
        let recorded = cfg.to_run_toml(&run_dir).unwrap();
        std::fs::write(run_dir.join("config.toml"), recorded).unwrap();
        let real_dir = base.join("disk/deep/runs/r");
        for dir in [&run_dir, &real_dir] {
            let back = Config::load(&dir.join("config.toml"), &[]).unwrap();
            assert_eq!(
                back.model.name,
                base.join("m").display().to_string(),
                "{dir:?}"
            );
            assert_eq!(real_path(&back.run_dir()), real_dir, "{dir:?}");
        }
    }
}
