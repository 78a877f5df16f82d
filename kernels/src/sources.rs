//! The embedded CUDA sources, and their expansion into self-contained translation units.
//!
//! NVRTC is handed one string per module, so the `#include "x.cuh"` lines of a source
//! are replaced here by the header text (each header once), with `#line` markers so
//! NVRTC's diagnostics still name the right file and line.

use std::collections::HashSet;

use crate::KernelError;

/// The kernel modules, one per op family: `(file name, source)`.
pub const SOURCES: &[(&str, &str)] = &[
    ("embed.cu", include_str!("../embed.cu")),
    ("rmsnorm.cu", include_str!("../rmsnorm.cu")),
    ("elementwise.cu", include_str!("../elementwise.cu")),
    ("matvec.cu", include_str!("../matvec.cu")),
    ("mmq.cu", include_str!("../mmq.cu")),
    ("dequant.cu", include_str!("../dequant.cu")),
    ("gemm.cu", include_str!("../gemm.cu")),
    ("rope_kv.cu", include_str!("../rope_kv.cu")),
    ("attn_decode.cu", include_str!("../attn_decode.cu")),
    ("attn_prefill.cu", include_str!("../attn_prefill.cu")),
    ("argmax.cu", include_str!("../argmax.cu")),
];

/// Headers the modules include: `(file name, source)`.
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../common.cuh")),
    ("quant.cuh", include_str!("../quant.cuh")),
];

/// The source of module `name` (e.g. `"matvec.cu"`).
pub fn source(name: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Module `name` with its includes expanded: the exact text NVRTC compiles (and the
/// kernel cache keys on).
pub fn expand(name: &str) -> Result<String, KernelError> {
    let src = source(name).ok_or_else(|| KernelError::UnknownModule(name.to_string()))?;
    let mut out = String::with_capacity(src.len() * 2);
    let mut seen = HashSet::new();
    expand_into(name, name, src, &mut seen, &mut out)?;
    Ok(out)
}

fn expand_into(
    module: &str,
    file: &str,
    src: &str,
    seen: &mut HashSet<&'static str>,
    out: &mut String,
) -> Result<(), KernelError> {
    for (i, line) in src.lines().enumerate() {
        let Some(header) = quoted_include(line) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let (hname, htext) = HEADERS.iter().find(|(n, _)| *n == header).ok_or_else(|| {
            KernelError::UnknownHeader {
                module: module.to_string(),
                header: header.to_string(),
            }
        })?;
        if seen.insert(hname) {
            out.push_str(&format!("#line 1 \"{hname}\"\n"));
            expand_into(module, hname, htext, seen, out)?;
        }
        // Back to the including file, at the line after the #include.
        out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
    }
    Ok(())
}

/// The file name of an `#include "name"` line, if `line` is one.
fn quoted_include(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let rest = rest.strip_prefix("include")?.trim_start();
    let rest = rest.strip_prefix('"')?;
    rest.split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_expands_to_a_translation_unit_without_quoted_includes() {
        for (name, _) in SOURCES {
            let text = expand(name).unwrap();
            assert!(
                text.lines().all(|l| quoted_include(l).is_none()),
                "{name} still has an #include"
            );
            assert!(text.contains("#define SPARKD_KV_BLOCK_TOKENS"), "{name}");
            // The shared header comes in once even when two headers include it.
            assert_eq!(text.matches("#line 1 \"common.cuh\"").count(), 1, "{name}");
        }
    }

    #[test]
    fn line_markers_point_back_at_the_line_after_the_include() {
        let text = expand("embed.cu").unwrap();
        let src = source("embed.cu").unwrap();
        let include_line = src
            .lines()
            .position(|l| quoted_include(l).is_some())
            .unwrap();
        let marker = format!("#line {} \"embed.cu\"", include_line + 2);
        let after = text.split(&marker).nth(1).expect("marker present");
        let next_src_line = src.lines().nth(include_line + 1).unwrap();
        assert_eq!(after.lines().nth(1), Some(next_src_line));
    }

    #[test]
    fn unknown_modules_and_headers_are_errors() {
        assert!(matches!(
            expand("nope.cu"),
            Err(KernelError::UnknownModule(_))
        ));
        let mut out = String::new();
        let err = expand_into(
            "m.cu",
            "m.cu",
            "#include \"missing.cuh\"\n",
            &mut HashSet::new(),
            &mut out,
        );
        assert!(matches!(err, Err(KernelError::UnknownHeader { .. })));
        assert_eq!(quoted_include("  #  include \"a.cuh\" // x"), Some("a.cuh"));
        assert_eq!(quoted_include("#include <cuda_fp16.h>"), None);
    }

    #[test]
    fn every_module_documents_its_entry_points_at_the_top() {
        for (name, src) in SOURCES {
            assert!(
                src.starts_with(&format!("// {name} - ")),
                "{name} must open with a `// {name} - ...` summary"
            );
            let header: String = src
                .lines()
                .take_while(|l| l.starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(
                header.contains("extern \"C\" __global__"),
                "{name}: the leading comment must give the entry-point signatures"
            );
            assert!(src.contains("extern \"C\" __global__"), "{name}");
        }
    }
}
