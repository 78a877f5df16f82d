//! `spark models`: the models on this machine (the models folder), the one the daemon
//! has loaded, and the known ones `spark pull` can fetch that are not here yet.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use spark_client::models::{self, KNOWN_MODELS};
use spark_client::protocol::ModelInfo;

use crate::{
    connect::{self, Autostart},
    exit, format, output, Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// One JSON object per model and line
    #[arg(long)]
    pub json: bool,
}

/// One model as listed (and as `--json` writes it).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Entry {
    /// What `--model` takes: the file's stem for a file in the models folder.
    pub name: String,
    /// `None`: a known model not downloaded yet.
    pub path: Option<PathBuf>,
    pub bytes: Option<u64>,
    /// The daemon that answered has it loaded.
    pub loaded: bool,
    /// `spark pull` knows it by this name.
    pub known: bool,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let dir = models::models_dir();
    // Listing the folder needs no daemon: without one, nothing shows as loaded.
    let loaded = match connect::connect(global, Autostart::Never).await {
        Ok(client) => Some(client.models().await?),
        Err(err) => {
            if !args.json {
                output::dim_line(&format!("({}; nothing shows as loaded)", first_line(&err)));
            }
            None
        }
    };
    let entries = list(&dir, loaded.as_deref().unwrap_or_default());
    if args.json {
        for entry in &entries {
            output::out_line(&serde_json::to_string(entry)?)?;
        }
    } else if entries.is_empty() {
        output::dim_line(&format!(
            "no models in {}; `spark pull` fetches the default one",
            dir.display()
        ));
    } else {
        output::out_line(&table(&entries))?;
    }
    Ok(exit::code(exit::OK))
}

fn first_line(err: &anyhow::Error) -> String {
    err.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The `.gguf` files in `dir` (by name), the loaded models that live elsewhere, then
/// the known models not in `dir`.
pub fn list(dir: &Path, loaded: &[ModelInfo]) -> Vec<Entry> {
    let is_loaded = |path: &Path| loaded.iter().any(|m| holds(path, m));
    let mut entries: Vec<Entry> = gguf_files(dir)
        .into_iter()
        .map(|(path, bytes)| {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Entry {
                known: models::known_model(&name).is_some(),
                loaded: is_loaded(&path),
                name,
                path: Some(path),
                bytes: Some(bytes),
            }
        })
        .collect();
    for model in loaded {
        let listed = (entries.iter()).any(|e| e.path.as_deref().is_some_and(|p| holds(p, model)));
        if !listed {
            entries.push(Entry {
                name: model.name.clone(),
                path: Some(PathBuf::from(&model.path)),
                bytes: Some(model.file_bytes),
                loaded: true,
                known: models::known_model(&model.name).is_some(),
            });
        }
    }
    for known in KNOWN_MODELS {
        if !entries
            .iter()
            .any(|e| e.known && e.name.eq_ignore_ascii_case(known.name))
        {
            entries.push(Entry {
                name: known.name.to_owned(),
                path: None,
                bytes: None,
                loaded: false,
                known: true,
            });
        }
    }
    entries
}

/// Whether the file at `path` is the daemon's loaded `model`.
fn holds(path: &Path, model: &ModelInfo) -> bool {
    models::names_model(&path.to_string_lossy(), &model.name, Path::new(&model.path))
}

/// Regular `.gguf` files directly in `dir` with their sizes, by file name; none when
/// the folder is missing or unreadable.
fn gguf_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(PathBuf, u64)> = read
        .filter_map(Result::ok)
        .filter(|e| {
            Path::new(&e.file_name())
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        })
        .filter_map(|e| {
            // Follows symlinks: a link to a model elsewhere is a model here.
            let meta = std::fs::metadata(e.path()).ok()?;
            meta.is_file().then(|| (e.path(), meta.len()))
        })
        .collect();
    files.sort();
    files
}

fn table(entries: &[Entry]) -> String {
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|e| {
            let size = e.bytes.map_or_else(|| "-".to_owned(), format::size);
            let state = match (e.loaded, &e.path) {
                (true, _) => "loaded".to_owned(),
                (false, Some(_)) => String::new(),
                (false, None) => format!("not downloaded: spark pull {}", e.name),
            };
            let path = e
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            [e.name.clone(), size, state, path]
        })
        .collect();
    format::table(
        &["NAME", "SIZE", "STATE", "PATH"],
        &[false, true, false, false],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_info(name: &str, path: &Path) -> ModelInfo {
        ModelInfo {
            name: name.into(),
            path: path.to_string_lossy().into_owned(),
            architecture: "llama".into(),
            quantization: "Q4_1".into(),
            parameters: 1,
            context_length: 1,
            file_bytes: 7,
        }
    }

    #[test]
    fn the_folder_the_loaded_model_and_the_known_ones_not_here() {
        let dir = std::env::temp_dir().join(format!("spark-models-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub.gguf")).unwrap();
        std::fs::write(dir.join("b-model.gguf"), b"12345").unwrap();
        std::fs::write(dir.join("a-model.GGUF"), b"1").unwrap();
        std::fs::write(dir.join("notes.txt"), b"not a model").unwrap();
        let elsewhere = dir.join("sub.gguf").join("far.gguf");
        std::fs::write(&elsewhere, b"1234567").unwrap();

        let none = list(&dir, &[]);
        let names: Vec<&str> = none.iter().map(|e| e.name.as_str()).collect();
        // Files by name (a folder named .gguf is not one), then the default model,
        // known and not downloaded.
        assert_eq!(names, ["a-model", "b-model", models::DEFAULT_MODEL]);
        assert_eq!(none[1].bytes, Some(5));
        assert!(none.iter().all(|e| !e.loaded));
        assert_eq!((none[2].path.as_ref(), none[2].known), (None, true));

        // Loaded from the folder (the daemon names it by its stem).
        let loaded = list(&dir, &[model_info("b-model", &dir.join("b-model.gguf"))]);
        assert_eq!(loaded.len(), 3);
        assert!(loaded[1].loaded && !loaded[0].loaded);

        // Loaded from elsewhere: listed too, after the folder's files.
        let far = list(&dir, &[model_info("far", &elsewhere)]);
        let names: Vec<&str> = far.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a-model", "b-model", "far", models::DEFAULT_MODEL]);
        assert!(far[2].loaded && far[2].path.as_deref() == Some(elsewhere.as_path()));
        assert_eq!(far[2].bytes, Some(7));

        let text = table(&far);
        assert!(text.starts_with("NAME"), "{text}");
        assert!(
            text.contains(&format!("spark pull {}", models::DEFAULT_MODEL)),
            "{text}"
        );
        assert!(text.lines().all(|l| l == l.trim_end()), "{text:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
