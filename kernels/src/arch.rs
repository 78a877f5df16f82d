//! GPU architectures the kernels are compiled for, parsed from `sm_NN` / `compute_NN`.

use std::fmt;
use std::str::FromStr;

use crate::KernelError;

/// The oldest architecture the kernels support: the prefill GEMM uses `cp.async`,
/// `ldmatrix` and `mma.sync` m16n8k16 with bf16, all sm_80+.
pub const MIN_SM: u32 = 80;

/// A GPU architecture, e.g. 90 for Hopper or 121 for GB10. Kernels are compiled to SASS
/// for the running device's own `sm_NN` (see `compile`), so the driver JIT-compiles
/// nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    sm: u32,
}

impl Arch {
    pub fn new(sm: u32) -> Result<Self, KernelError> {
        if (MIN_SM..1000).contains(&sm) {
            Ok(Arch { sm })
        } else {
            Err(KernelError::BadArch(sm.to_string()))
        }
    }

    /// From a device's compute capability, e.g. (12, 1) for GB10.
    pub fn from_capability(major: u32, minor: u32) -> Result<Self, KernelError> {
        if minor >= 10 {
            return Err(KernelError::BadArch(format!("{major}.{minor}")));
        }
        Self::new(major.saturating_mul(10).saturating_add(minor))
    }

    /// The number in `sm_NN`.
    pub fn sm(self) -> u32 {
        self.sm
    }

    /// The NVRTC `--gpu-architecture` value: SASS for the real architecture.
    pub fn nvrtc_target(self) -> String {
        format!("sm_{}", self.sm)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.sm)
    }
}

impl FromStr for Arch {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self, KernelError> {
        let bad = || KernelError::BadArch(s.to_string());
        let digits = s
            .strip_prefix("sm_")
            .or_else(|| s.strip_prefix("compute_"))
            .ok_or_else(bad)?;
        // Two or three digits only: keeps the value usable in file names as is.
        if !(2..=3).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let sm = digits.parse().map_err(|_| bad())?;
        Self::new(sm).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sm_and_compute_names() {
        assert_eq!("sm_90".parse::<Arch>().unwrap().sm(), 90);
        assert_eq!("compute_121".parse::<Arch>().unwrap().sm(), 121);
        assert_eq!(
            "compute_121".parse::<Arch>().unwrap().nvrtc_target(),
            "sm_121"
        );
        assert_eq!(Arch::from_capability(12, 1).unwrap().to_string(), "sm_121");
        assert_eq!(Arch::from_capability(9, 0).unwrap().to_string(), "sm_90");
    }

    #[test]
    fn rejects_old_malformed_and_path_like_names() {
        for bad in [
            "sm_75",
            "sm_",
            "sm_9",
            "sm_1000",
            "sm_90a",
            "90",
            "sm_9/../x",
            "compute_+90",
            "",
        ] {
            assert!(
                matches!(bad.parse::<Arch>(), Err(KernelError::BadArch(_))),
                "{bad}"
            );
        }
        assert!(Arch::from_capability(7, 5).is_err());
        assert!(Arch::from_capability(9, 12).is_err());
    }
}
