//! What the engine's calls fail with: the composition, a drafter, the
//! tokenizer, the configuration, a bad request, a plugin, MLX, a grammar,
//! or (under `--isolate`) what the engine process reported.

use host_loader::ComposeError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Compose(#[from] ComposeError),
    #[error(transparent)]
    Drafter(#[from] host_loader::services::DrafterError),
    #[error("{0}")]
    Tokenizer(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("model: {0}")]
    Model(String),
    #[error("mlx: {0}")]
    Mlx(String),
    #[error(transparent)]
    Grammar(#[from] crate::constraint::GrammarError),
    /// An error the isolated engine process reported (by its message), or
    /// its death.
    #[error("{0}")]
    Reported(String),
}

impl From<mlx_rs::error::ConversionError> for EngineError {
    fn from(e: mlx_rs::error::ConversionError) -> Self {
        EngineError::Mlx(e.to_string())
    }
}

impl From<mlx_rs::error::Exception> for EngineError {
    fn from(e: mlx_rs::error::Exception) -> Self {
        EngineError::Mlx(e.what().to_owned())
    }
}

/// A plugin error from a cache-layout or drafter call, named by the call.
pub(crate) fn model_err(what: &str) -> impl Fn(plugin_api::PluginError) -> EngineError + '_ {
    move |e| EngineError::Model(format!("{what}: {e}"))
}
