//! What a linear quantization is asked for: the integer storage type ([`QuantDtype`], with
//! coremltools' code ranges), the granularity of the scales and the symmetric/asymmetric
//! choice ([`QuantConfig`]). A leaf of `passes`, shared by `quant` (shape rules, decode,
//! error) and `quant_kernel` (the element loop).

/// Integer storage type of quantized weights (`--quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantDtype {
    Int4,
    Uint4,
    Int8,
    Uint8,
}

impl QuantDtype {
    /// Every storage type, in declaration order.
    pub const ALL: [QuantDtype; 4] = [
        QuantDtype::Int4,
        QuantDtype::Uint4,
        QuantDtype::Int8,
        QuantDtype::Uint8,
    ];

    pub fn nbits(self) -> u32 {
        match self {
            QuantDtype::Int4 | QuantDtype::Uint4 => 4,
            QuantDtype::Int8 | QuantDtype::Uint8 => 8,
        }
    }
    pub fn is_signed(self) -> bool {
        matches!(self, QuantDtype::Int4 | QuantDtype::Int8)
    }
    /// The MIL type name (`int4`, `uint4`, `int8`, `uint8`).
    pub fn mil_name(self) -> &'static str {
        match self {
            QuantDtype::Int4 => "int4",
            QuantDtype::Uint4 => "uint4",
            QuantDtype::Int8 => "int8",
            QuantDtype::Uint8 => "uint8",
        }
    }
    /// coremltools' `get_quant_range`: symmetric mode gives up the most negative code
    /// (signed) or the top code (unsigned) so that zero sits exactly in the middle.
    pub fn range(self, symmetric: bool) -> (i32, i32) {
        let n = self.nbits();
        let (mut lo, mut hi) = if self.is_signed() {
            (-(1i32 << (n - 1)), (1i32 << (n - 1)) - 1)
        } else {
            (0, (1i32 << n) - 1)
        };
        if symmetric {
            if self.is_signed() {
                lo += 1;
            } else {
                hi -= 1;
            }
        }
        (lo, hi)
    }
}

/// Which elements share one scale (and offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantGranularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One scale per output channel (axis 0).
    PerChannel,
    /// One scale per output channel and block of `n` input channels (axis 1).
    PerBlock(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantConfig {
    pub dtype: QuantDtype,
    pub granularity: QuantGranularity,
    /// coremltools' `linear_symmetric` (its default) when true, `linear` otherwise.
    pub symmetric: bool,
}

impl Default for QuantConfig {
    fn default() -> Self {
        QuantConfig {
            dtype: QuantDtype::Int8,
            granularity: QuantGranularity::PerChannel,
            symmetric: true,
        }
    }
}
