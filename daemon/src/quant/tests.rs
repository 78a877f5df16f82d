//! Checks against the reference vectors in `daemon/tests/fixtures/quant/` (made by
//! `make_quant_fixtures.py` from the `gguf` package and ggml's C reference code).

use super::*;

struct Fixture {
    input: Vec<f32>,
    encoded: Vec<u8>,
    decoded: Vec<f32>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

macro_rules! fixture_bytes {
    ($name:literal) => {
        include_bytes!(concat!("../../tests/fixtures/quant/", $name, ".bin")).as_slice()
    };
}

fn fixture(ty: GgmlType) -> Fixture {
    let raw: &[u8] = match ty {
        GgmlType::F32 => fixture_bytes!("F32"),
        GgmlType::F16 => fixture_bytes!("F16"),
        GgmlType::BF16 => fixture_bytes!("BF16"),
        GgmlType::Q4_0 => fixture_bytes!("Q4_0"),
        GgmlType::Q4_1 => fixture_bytes!("Q4_1"),
        GgmlType::Q5_0 => fixture_bytes!("Q5_0"),
        GgmlType::Q5_1 => fixture_bytes!("Q5_1"),
        GgmlType::Q8_0 => fixture_bytes!("Q8_0"),
        GgmlType::Q8_1 => fixture_bytes!("Q8_1"),
        GgmlType::Q2_K => fixture_bytes!("Q2_K"),
        GgmlType::Q3_K => fixture_bytes!("Q3_K"),
        GgmlType::Q4_K => fixture_bytes!("Q4_K"),
        GgmlType::Q5_K => fixture_bytes!("Q5_K"),
        GgmlType::Q6_K => fixture_bytes!("Q6_K"),
        GgmlType::Q8_K => fixture_bytes!("Q8_K"),
        GgmlType::IQ4_NL => fixture_bytes!("IQ4_NL"),
        GgmlType::IQ4_XS => fixture_bytes!("IQ4_XS"),
    };
    let n = u32::from_le_bytes(raw[0..4].try_into().unwrap()) as usize;
    let nb = u32::from_le_bytes(raw[4..8].try_into().unwrap()) as usize;
    let encoded = raw[8..8 + nb].to_vec();
    let decoded = f32s(&raw[8 + nb..]);
    assert_eq!(decoded.len(), n, "{ty} fixture is truncated");
    let input = f32s(fixture_bytes!("input"));
    assert_eq!(input.len(), n);
    Fixture {
        input,
        encoded,
        decoded,
    }
}

const ALL: [GgmlType; 17] = GgmlType::ALL;

#[test]
fn dequantize_matches_reference_bit_for_bit() {
    for ty in ALL {
        let f = fixture(ty);
        let mut out = vec![0.0f32; f.decoded.len()];
        dequantize(ty, &f.encoded, &mut out).unwrap();
        for (i, (a, b)) in out.iter().zip(&f.decoded).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{ty} element {i}: {a} vs reference {b}"
            );
        }
    }
}

#[test]
fn quantize_matches_reference_bytes() {
    for ty in ALL {
        let f = fixture(ty);
        let mut out = vec![0u8; f.encoded.len()];
        quantize(ty, &f.input, &mut out).unwrap();
        let first_diff = out.iter().zip(&f.encoded).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{ty}: bytes differ from the reference");
    }
}

/// Reconstruction error of each format on smooth random data, relative to the largest
/// magnitude: catches a quantizer that is self-consistent but wrong.
#[test]
fn round_trip_error_is_within_format_precision() {
    let n = 4096;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let x: Vec<f32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u32 << 23) as f32) - 1.0
        })
        .collect();
    for (ty, tol) in [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 1e-3),
        (GgmlType::BF16, 4e-3),
        // A full step at the clamped end of the symmetric formats, half a step elsewhere.
        (GgmlType::Q4_0, 0.13),
        (GgmlType::Q4_1, 0.07),
        (GgmlType::Q5_0, 0.065),
        (GgmlType::Q5_1, 0.035),
        (GgmlType::Q8_0, 0.005),
        (GgmlType::Q8_1, 0.005),
        (GgmlType::Q2_K, 0.34),
        (GgmlType::Q3_K, 0.25),
        (GgmlType::Q4_K, 0.11),
        (GgmlType::Q5_K, 0.05),
        (GgmlType::Q6_K, 0.02),
        (GgmlType::Q8_K, 0.005),
        (GgmlType::IQ4_NL, 0.12),
        (GgmlType::IQ4_XS, 0.12),
    ] {
        let mut q = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
        quantize(ty, &x, &mut q).unwrap();
        let mut y = vec![0.0f32; n];
        dequantize(ty, &q, &mut y).unwrap();
        let worst = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= tol, "{ty}: worst error {worst} > {tol}");
    }
}

#[test]
fn sizes_are_checked() {
    let mut out = vec![0.0f32; 64];
    assert_eq!(
        dequantize(GgmlType::Q4_0, &[0u8; 35], &mut out),
        Err(QuantError::LengthMismatch {
            ty: GgmlType::Q4_0,
            elems: 64,
            expected: 36,
            got: 35
        })
    );
    let mut odd = vec![0.0f32; 48];
    assert_eq!(
        dequantize(GgmlType::Q8_0, &[0u8; 51], &mut odd),
        Err(QuantError::NotBlockMultiple {
            ty: GgmlType::Q8_0,
            elems: 48
        })
    );
    let mut bytes = vec![0u8; 143];
    assert!(quantize(GgmlType::Q4_K, &[0.0; 256], &mut bytes).is_err());
    assert!(quantize(GgmlType::Q6_K, &[0.0; 128], &mut [0u8; 105]).is_err());
}

#[test]
fn bf16_rounds_to_nearest_even_and_keeps_nan_quiet() {
    let cases = [
        (1.0f32, 0x3f80u16),
        (f32::from_bits(0x3f80_8000), 0x3f80), // tie, even stays
        (f32::from_bits(0x3f81_8000), 0x3f82), // tie, odd rounds up
        (f32::from_bits(0x3f80_8001), 0x3f81),
        (f32::from_bits(0x7f80_0001), 0x7fc0), // signalling NaN becomes quiet
        (f32::INFINITY, 0x7f80),
    ];
    for (v, bits) in cases {
        let mut b = [0u8; 2];
        quantize(GgmlType::BF16, &[v], &mut b).unwrap();
        assert_eq!(u16::from_le_bytes(b), bits, "{v:e}");
    }
}

#[test]
fn zero_input_gives_zero_output() {
    for ty in ALL {
        let n = ty.block_elems().max(QK_K);
        let mut q = vec![0xAAu8; ty.bytes_for(n as u64).unwrap() as usize];
        quantize(ty, &vec![0.0; n], &mut q).unwrap();
        let mut y = vec![1.0f32; n];
        dequantize(ty, &q, &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn the_type_list_is_every_id_sparkd_maps_and_names_parse_back() {
    let mapped: Vec<GgmlType> = (0..64).filter_map(GgmlType::from_id).collect();
    assert_eq!(mapped, GgmlType::ALL);
    for ty in GgmlType::ALL {
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        let named = GgmlType::weight_type_named(&ty.name().to_lowercase());
        assert_eq!(named, ty.is_weight_type().then_some(ty), "{ty}");
    }
    assert_eq!(GgmlType::weight_type_named("Q4_K_M"), None);
}
