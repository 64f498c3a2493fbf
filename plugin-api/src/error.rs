//! Errors are values at the boundary: every fallible call returns
//! `RResult<_, PluginError>`, and no panic crosses (the SDK guards every
//! export with `catch_unwind`, so a panic arrives as [`ErrorCode::PANIC`]).

use abi_stable::std_types::RString;
use abi_stable::StableAbi;
use std::fmt;

/// An open set of error categories (a `u8`, so v1.x may add codes).
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub u8);

impl ErrorCode {
    /// config.json (or another artifact) is invalid for this plugin.
    pub const INVALID_CONFIG: Self = Self(1);
    /// A call's arguments are invalid (shape, range, state).
    pub const INVALID_INPUT: Self = Self(2);
    /// The operation is not supported by this plugin (see its capabilities).
    pub const UNSUPPORTED: Self = Self(3);
    /// MLX raised an error; the message is MLX's own.
    pub const MLX: Self = Self(4);
    /// Reading files failed.
    pub const IO: Self = Self(5);
    /// The plugin panicked; the message is the panic payload.
    pub const PANIC: Self = Self(6);
    /// Anything else.
    pub const INTERNAL: Self = Self(7);

    pub fn name(self) -> &'static str {
        match self.0 {
            1 => "invalid config",
            2 => "invalid input",
            3 => "unsupported",
            4 => "mlx",
            5 => "io",
            6 => "panic",
            7 => "internal",
            _ => "unknown",
        }
    }
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginError {
    pub code: ErrorCode,
    pub message: RString,
}

impl PluginError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: RString::from(message.into()) }
    }
    pub fn invalid_config(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_CONFIG, m)
    }
    pub fn invalid_input(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::INVALID_INPUT, m)
    }
    pub fn unsupported(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::UNSUPPORTED, m)
    }
    pub fn mlx(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::MLX, m)
    }
    pub fn io(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::IO, m)
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for PluginError {}

/// The result type of every fallible boundary call.
pub type PResult<T> = abi_stable::std_types::RResult<T, PluginError>;
