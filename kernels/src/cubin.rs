//! Reading the cubins NVRTC writes (CUDA ELF images of SASS for one `sm_NN`): the
//! architecture they are for and the kernels they define. The loader needs the names;
//! the cache uses both to tell a whole, matching file from a damaged or foreign one.

use object::elf;
use object::read::elf::{ElfFile64, FileHeader};
use object::{Endianness, Object, ObjectSection};

/// What a cubin holds, as far as sparkd cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinInfo {
    /// The SASS architecture, e.g. 90 for `sm_90`.
    pub sm: u32,
    /// Kernel (entry function) names, in section order.
    pub entries: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a CUDA cubin: {0}")]
pub struct CubinError(String);

/// Parses `image`. Every kernel has a `.nv.info.<name>` section of launch attributes
/// (parameters, block limits); device functions and data do not.
pub fn inspect(image: &[u8]) -> Result<CubinInfo, CubinError> {
    let file = ElfFile64::<Endianness>::parse(image).map_err(|e| CubinError(e.to_string()))?;
    let header = file.elf_header();
    let endian = file.endian();
    if header.e_machine(endian) != elf::EM_CUDA {
        return Err(CubinError(format!(
            "ELF machine {} is not EM_CUDA ({})",
            header.e_machine(endian),
            elf::EM_CUDA
        )));
    }
    let sm = sm_from_flags(header.e_ident().abi_version, header.e_flags(endian));
    let mut entries = Vec::new();
    for section in file.sections() {
        let name = section.name().map_err(|e| CubinError(e.to_string()))?;
        if let Some(kernel) = name.strip_prefix(".nv.info.") {
            entries.push(kernel.to_string());
        }
    }
    Ok(CubinInfo { sm, entries })
}

/// The SASS architecture in a cubin's `e_flags`. CUDA 13's ELF ABI (version 8) keeps it
/// in bits 8..16 (sm_90: 0x0600_5a04); older ones in the low byte (sm_90: 0x005a_055a).
fn sm_from_flags(abi_version: u8, flags: u32) -> u32 {
    if abi_version >= 8 {
        (flags >> 8) & 0xff
    } else {
        flags & 0xff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_architecture_is_read_from_either_flags_layout() {
        // Flags of NVRTC 13.0 cubins for sm_90 and sm_121, and of a CUDA 12 one.
        assert_eq!(sm_from_flags(8, 0x0600_5a04), 90);
        assert_eq!(sm_from_flags(8, 0x0600_7902), 121);
        assert_eq!(sm_from_flags(7, 0x005a_055a), 90);
    }

    #[test]
    fn other_bytes_are_refused_without_panicking() {
        for bytes in [
            &b""[..],
            b"\x7fELF",
            b"//\n.version 9.0\n.target sm_90\n",
            &[0u8; 64],
        ] {
            assert!(inspect(bytes).is_err(), "{bytes:?}");
        }
        // A host ELF (this test binary's own format) is not a cubin.
        let host = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let err = inspect(&host).unwrap_err();
        assert!(err.to_string().contains("EM_CUDA"), "{err}");
    }
}
