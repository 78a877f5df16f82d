//! An open GGUF file: the validated header plus the file bytes (memory-mapped, copied
//! into the process's own memory, or owned for tests and fuzzing), from which tensor
//! data is borrowed without copying.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use memmap2::{Mmap, MmapMut};

use super::error::GgufError;
use super::metadata::Metadata;
use super::parse::{parse, Header};
use super::tensor::TensorInfo;

/// Memory alignment of the file's first byte when it is held in a `Vec`, so tensor
/// data is as aligned in memory as in the file (up to this), as it is when mapped.
const OWNED_ALIGN: usize = 64;

enum Backing {
    /// A read-only mapping of the file, which stays open so that released ranges can
    /// also be dropped from the page cache.
    Mmap { map: Mmap, file: File },
    /// Anonymous memory holding a copy of the file, read-only after loading.
    Copied(Mmap),
    /// The file is `buf[start..]`; `start` pads it to `OWNED_ALIGN` in memory.
    Owned { buf: Vec<u8>, start: usize },
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Mmap { map: m, .. } | Self::Copied(m) => m,
            Self::Owned { buf, start } => buf.get(*start..).unwrap_or_default(),
        }
    }

    /// Keeps `bytes` if it already starts on `OWNED_ALIGN`, otherwise copies it to an
    /// offset that does (allocators only promise 8 or 16). Block and f32 views of
    /// tensor data can then rely on alignment whichever way the file was loaded.
    fn owned(bytes: Vec<u8>) -> Self {
        let misalignment = |v: &Vec<u8>| v.as_ptr().addr().wrapping_neg() % OWNED_ALIGN;
        if bytes.is_empty() || misalignment(&bytes) == 0 {
            return Self::Owned {
                buf: bytes,
                start: 0,
            };
        }
        let mut buf = Vec::with_capacity(bytes.len() + OWNED_ALIGN);
        let start = misalignment(&buf);
        buf.resize(start, 0);
        // Within capacity: the heap buffer does not move, so `start` stays aligned.
        buf.extend_from_slice(&bytes);
        Self::Owned { buf, start }
    }
}

/// A parsed GGUF file. Only the header is parsed on open; tensor data stays in the page
/// cache until a caller reads it through [`tensor_data`](Self::tensor_data).
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_len", &self.file_len())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps `path` read-only and parses its header.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let map = map_read_only(&file).map_err(io)?;
        Self::from_backing(Backing::Mmap { map, file })
    }

    /// Reads `path` into anonymous memory of its own and parses it: what a server that
    /// keeps a model for days wants. Unlike a mapping, the copy cannot change or fault
    /// (SIGBUS) when someone rewrites or truncates the file in place, and it lives in
    /// transparent huge pages where the kernel allows. Page cache is dropped behind the
    /// reads, so the file is not held twice in memory (on unified-memory machines the GPU
    /// shares that memory).
    pub fn load(path: &Path) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let len = usize::try_from(len).map_err(|_| {
            io(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                "file larger than the address space",
            ))
        })?;
        if len == 0 {
            return Self::from_bytes(Vec::new());
        }
        let mut copy = MmapMut::map_anon(len).map_err(io)?;
        #[cfg(target_os = "linux")]
        let _ = copy.advise(memmap2::Advice::HugePage);
        read_exactly(&mut file, &mut copy).map_err(io)?;
        let copy = copy.make_read_only().map_err(io)?;
        Self::from_backing(Backing::Copied(copy))
    }

    /// Parses a file held in memory. The bytes may be copied once, to align them.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(Backing::owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<GgufFile, GgufError> {
        let Header {
            version,
            metadata,
            tensors,
            index,
            alignment,
            data_offset,
        } = parse(backing.bytes())?;
        Ok(GgufFile {
            backing,
            version,
            metadata,
            tensors,
            index,
            alignment,
            data_offset,
        })
    }

    /// GGUF format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Like [`tensor`](Self::tensor), with a [`GgufError::MissingTensor`] naming it.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))
    }

    /// The bytes of tensor `t`. Ranges of this file's infos were checked at parse time;
    /// an info from another file whose range does not fit gives an empty slice.
    ///
    /// In memory the slice is aligned to the file's alignment, up to 64 bytes for
    /// [`from_bytes`](Self::from_bytes) and up to the page size for [`open`](Self::open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        range.and_then(|r| self.bytes().get(r)).unwrap_or_default()
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    pub fn file_len(&self) -> u64 {
        self.bytes().len() as u64
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset of the data section, to which tensor offsets in the file are relative.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Gives back the memory of `offset..offset + len`, whose contents were copied
    /// elsewhere (packed at load, uploaded to a GPU) and are never read in place again,
    /// so they stop counting towards resident memory. For a file mapping a later read
    /// would fault the bytes back in from the file, and the range's page cache is
    /// dropped too (the GPU copy is the one that stays: on unified-memory machines the
    /// cache would hold the model a second time in the same memory); for the private
    /// copy of [`load`](Self::load) it would read zeros, which is why only tensors that
    /// were repacked are released. Does nothing for owned bytes; a failed `madvise` or
    /// `posix_fadvise` leaves the memory where it was.
    pub fn release_pages(&self, offset: usize, len: usize) {
        let (map, file) = match &self.backing {
            Backing::Mmap { map, file } => (map, Some(file)),
            Backing::Copied(map) => (map, None),
            Backing::Owned { .. } => return,
        };
        let Some(end) = offset.checked_add(len).filter(|&end| end <= map.len()) else {
            return;
        };
        // Only whole pages inside the range: madvise works on pages, and a page shared
        // with a neighbouring tensor must keep its bytes (the copy's would read as zeros).
        // The mapping starts on a page, so offsets into it line up with pages.
        let page = page_size();
        let (start, end) = (offset.next_multiple_of(page), end / page * page);
        if start >= end {
            return;
        }
        // SAFETY: DONTNEED drops a private mapping's pages; for a read-only file mapping
        // (nothing in it can have been modified) that discards nothing: the next access
        // reads the same bytes from the file again. For the anonymous copy the pages
        // read as zeros afterwards, which no memory-safety property depends on (they
        // are plain bytes); the caller only releases tensors it repacked, and the range
        // was shrunk to pages no other tensor shares.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
        // Unmapped from this process first: the kernel keeps cache pages that are
        // still mapped. Clean pages only, so nothing is lost.
        if let Some(file) = file {
            drop_cached(file, start, end - start);
        }
    }

    /// Whether the bytes are memory-mapped (as opposed to owned).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mmap { .. })
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf only reads its argument.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// Bytes read per call: large enough to stream at disk speed, and the unit in which
/// page cache is dropped behind the reads.
const READ_CHUNK: usize = 64 << 20;

/// Fills `dst` from `file`, which must hold exactly `dst.len()` bytes: a file that
/// shrinks or grows while it is read is an error, not a model.
fn read_exactly(file: &mut File, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let end = (done + READ_CHUNK).min(dst.len());
        match file.read(&mut dst[done..end]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file shrank while it was read ({done} of {} bytes)",
                        dst.len()
                    ),
                ))
            }
            Ok(n) => {
                drop_cached(file, done, n);
                done += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut probe = [0u8; 1];
    if file.read(&mut probe)? != 0 {
        return Err(std::io::Error::other("the file grew while it was read"));
    }
    Ok(())
}

/// Asks the kernel to drop the page cache of bytes already copied (a hint; clean pages
/// only, so nothing is lost).
fn drop_cached(file: &File, offset: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is
        // open for the duration of the call.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// The `unsafe` of mapping the file (the other is the page release above).
fn map_read_only(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the mapping is read-only and only ever exposed as `&[u8]`. memmap2's
    // caveat is that another process truncating or rewriting the file while it is
    // mapped changes (or faults on) memory Rust considers immutable. Model files are
    // written once and replaced by rename (as `GgufWriter::write_file` does), which
    // leaves an existing mapping on the old inode intact. The daemon does not rely on
    // that: it serves from a private copy (`GgufFile::load`).
    unsafe { Mmap::map(file) }
}
