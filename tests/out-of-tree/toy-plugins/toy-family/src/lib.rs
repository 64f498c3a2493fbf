//! Model family `toy-family`: model_type `toy-bigram` (architecture
//! `ToyBigramForCausalLM`), written against plugin-api alone, out of tree.
//!
//! The graph is a bigram model: `logits = embed(tokens) @ head.T`, with
//! `embed.weight [V, H]` and `head.weight [V, H]` read from
//! model.safetensors. It declares ONE full-attention layer (1 KV head of
//! dimension H) and really stores its embeddings through that layer's cache:
//! the hidden state it projects is the tail of what the cache layout hands
//! back, so a layout that stored or returned the wrong positions would change
//! the tokens. The logits still depend on the current token only.

use model_kit::config::Config;
use model_kit::ops::{dtype_from_raw, slice};
use model_kit::shape::expect_shape;
use model_kit::weights::Weights;
use model_kit::{error, Array, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSliceMut, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_error, rstrings, view, Locked};
use std::path::Path;

/// The plugin's name (the `twin` variant claims the same strings under another name).
const NAME: &str = if cfg!(feature = "twin") { "toy-family-twin" } else { "toy-family" };

/// The ABI generation the manifest declares (skewed on purpose by a test variant).
const DECLARED_ABI: u32 = if cfg!(feature = "skew-abi-version") { ABI_VERSION + 1 } else { ABI_VERSION };

pub const MODEL_TYPE: &str = "toy-bigram";
pub const ARCHITECTURE: &str = "ToyBigramForCausalLM";

#[cfg(not(feature = "skew-layout"))]
plugin_sdk::export_plugin! {
    manifest: manifest,
    init: init,
    plan_model: plan_model,
    open_model: open_model,
}

fn manifest() -> PluginManifest {
    PluginManifest {
        name: NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        abi_version: DECLARED_ABI,
        kind: PluginKind::MODEL_FAMILY,
        description: "toy bigram graph (third-party proof of the plugin ABI)".into(),
        claims: Claims {
            model_types: rstrings(&[MODEL_TYPE]),
            architectures: rstrings(&[ARCHITECTURE]),
            ..Default::default()
        },
        // Only what the graph really does: the embeddings and head are
        // reachable (embed / lm_head), its one layer's output can be tapped
        // (the embeddings); no batching promise.
        capabilities: rstrings(&[caps::SHARED_EMBEDDINGS, caps::HIDDEN_TAPS]),
        extra: RVec::new(),
    }
}

fn init(host: &HostInfo) -> std::result::Result<(), PluginError> {
    if cfg!(feature = "panic-in-init") {
        panic!("toy-family refuses to start (built with feature panic-in-init)");
    }
    if host.abi_version != ABI_VERSION {
        return Err(PluginError::unsupported(format!(
            "toy-family speaks plugin ABI v{ABI_VERSION}, the host v{}",
            host.abi_version
        )));
    }
    Ok(())
}

/// config.json, validated before anything reaches MLX.
struct Args {
    vocab: i32,
    hidden: i32,
    dtype: Dtype,
}

impl Args {
    fn parse(text: &str) -> std::result::Result<Self, PluginError> {
        let bad = |e: model_kit::Exception| PluginError::invalid_config(e.what());
        let cfg = Config::parse(text).map_err(bad)?;
        // Positive and below 2^31, or a clear error naming the key.
        let vocab = cfg.usize("vocab_size").map_err(bad)?;
        let hidden = cfg.usize("hidden_size").map_err(bad)?;
        if vocab.checked_mul(hidden).is_none_or(|n| n > 1 << 28) {
            return Err(PluginError::invalid_config(format!(
                "vocab_size {vocab} x hidden_size {hidden} is too large for a toy"
            )));
        }
        let dtype = match cfg.str("torch_dtype").unwrap_or("float32") {
            "float32" => Dtype::FLOAT32,
            "bfloat16" => Dtype::BFLOAT16,
            "float16" => Dtype::FLOAT16,
            other => {
                return Err(PluginError::invalid_config(format!(
                    "config.json: torch_dtype `{other}` is not float32, bfloat16 or float16"
                )))
            }
        };
        Ok(Self { vocab: vocab as i32, hidden: hidden as i32, dtype })
    }

    fn plan(&self) -> ModelPlan {
        let h = self.hidden as u32;
        ModelPlan {
            // One full-attention layer: 1 KV head of dimension H holds the embeddings.
            layers: RVec::from(vec![LayerNeed {
                kind: NeedKind::FULL,
                window: 0,
                kv_heads: 1,
                k_head_dim: h,
                v_head_dim: h,
                state_shapes: RVec::new(),
            }]),
            vocab_size: self.vocab as u32,
            hidden_size: h,
            max_context: 0,
            weights_dtype: self.dtype,
            quant_bits: 0,
            quant_group_size: 0,
            capabilities: rstrings(&[caps::SHARED_EMBEDDINGS]),
        }
    }
}

fn plan_model(config: &str) -> std::result::Result<ModelPlan, PluginError> {
    Ok(Args::parse(config)?.plan())
}

fn open_model(a: &ModelOpenArgs) -> std::result::Result<ModelBox, PluginError> {
    let args = Args::parse(&a.config_json)?;
    let compute = match a.compute_dtype {
        ROption::RSome(d) => Some(dtype_from_raw(d.0).map_err(|e| PluginError::invalid_input(e.what()))?),
        ROption::RNone => None,
    };
    let mut w = Weights::load(Path::new(a.dir.as_str())).map_err(|e| PluginError::io(e.what()))?;
    // Every tensor against the shape config.json implies, before any graph
    // is built: a lying config fails here, naming the tensor.
    let mut take = |name: &str| -> std::result::Result<Array, PluginError> {
        let bad = |e: model_kit::Exception| PluginError::invalid_config(e.what());
        let t = w.take(name).map_err(bad)?;
        expect_shape(name, t.shape(), &[args.vocab as usize, args.hidden as usize]).map_err(bad)?;
        match compute {
            Some(dt) if t.dtype() != dt => t.as_dtype(dt).map_err(mlx_error),
            _ => Ok(t),
        }
    };
    let embed = take("embed.weight")?;
    let head = take("head.weight")?;
    let left = w.remaining();
    if !left.is_empty() {
        return Err(PluginError::invalid_config(format!("unexpected tensors in the checkpoint: {}", left.join(", "))));
    }
    // Read (and cast) the weights now: a bad file fails at load, not in the first request.
    mlx_rs::transforms::eval([&embed, &head]).map_err(mlx_error)?;
    let graph = Bigram { plan: args.plan(), tables: Locked::new(Tables { embed, head }) };
    Ok(ModelGraph_TO::from_value(graph, TD_Opaque))
}

struct Bigram {
    plan: ModelPlan,
    /// `ModelGraph` must be `Sync`; mlx-rs arrays are only `Send`.
    /// `Locked` makes them shareable without `unsafe` (its docs say why a
    /// lock, never contended by the host, is the sound way).
    tables: Locked<Tables>,
}

struct Tables {
    embed: Array,
    head: Array,
}

impl Tables {
    fn embed(&self, ids: &Array) -> Result<Array> {
        self.embed.take_axis(ids, 0)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        h.matmul(self.head.transpose_axes(&[1, 0])?)
    }
}

impl Bigram {
    /// Refuses what this graph cannot do, with the error code that says why.
    fn check(&self, args: &ForwardArgs<'_>, caches: usize) -> std::result::Result<(), PluginError> {
        if let Some(bad) = args.taps.iter().find(|&&i| i != 0) {
            return Err(PluginError::invalid_input(format!("tap at layer {bad}, the model has 1 layer")));
        }
        if ![LogitsMode::NONE, LogitsMode::LAST, LogitsMode::ALL].contains(&args.logits) {
            // An open set: a newer host may send a mode this plugin predates.
            return Err(PluginError::unsupported(format!("unknown logits mode {}", args.logits.0)));
        }
        if caches != 1 {
            return Err(PluginError::invalid_input(format!("{caches} caches given for 1 layer")));
        }
        let tokens = view(args.tokens);
        if tokens.ndim() != 2 || tokens.shape()[1] == 0 {
            return Err(PluginError::invalid_input(format!(
                "tokens must be [B, L] with L > 0, got {:?}",
                tokens.shape()
            )));
        }
        Ok(())
    }

    fn run(&self, args: &ForwardArgs<'_>, cache: &mut CacheBox) -> Result<ForwardOutput> {
        let tables = self.tables.lock();
        // Borrowed for the call: `view` never frees the host's handle.
        let tokens = view(args.tokens);
        let (b, l, hd) = (tokens.shape()[0], tokens.shape()[1], self.plan.hidden_size as i32);
        let x = tables.embed(&tokens)?; // [B, L, H]

        // The cache-layout protocol, in order: positions, the mask for the
        // L new queries (before the update), then update_and_fetch.
        let pos = cache.positions().into_result().map_err(|e| error(format!("cache layout: {e}")))?;
        let mask = cache.attention_mask(l as u32).into_result().map_err(|e| error(format!("cache layout: {e}")))?;
        if ![MaskMode::NONE, MaskMode::CAUSAL, MaskMode::ARRAY].contains(&mask.mode) {
            return Err(error(format!("cache layout: unknown mask mode {}", mask.mode.0)));
        }
        drop(mask); // a bigram attends to nothing; an ARRAY mask's tensor is ours and freed here
        let kv = x.reshape(&[b, 1, l, hd])?; // [B, kv_heads = 1, L, H]
                                             // Transferred: the layout owns these handles now (it frees them).
        let fetched = cache
            .update_and_fetch(into_tensor(kv.clone()), into_tensor(kv))
            .into_result()
            .map_err(|e| error(format!("cache layout: {e}")))?;
        // Returned handles are ours: into_array takes ownership, Drop frees.
        let keys = into_array(fetched.keys);
        let _values = into_array(fetched.values);
        let total = keys.shape()[2];
        if keys.ndim() != 4 || total as u64 != pos.offset + l as u64 {
            return Err(error(format!(
                "cache layout returned keys {:?}; expected {} positions (offset {} + {l} new)",
                keys.shape(),
                pos.offset + l as u64,
                pos.offset
            )));
        }
        // The hidden state is the tail of what the cache holds: this step's embeddings.
        let h = slice(&keys, &[0, 0, total - l, 0], &[b, 1, total, hd])?.reshape(&[b, l, hd])?;

        let logits = match args.logits {
            LogitsMode::LAST => ROption::RSome(into_tensor(tables.head(&slice(&h, &[0, l - 1, 0], &[b, l, hd])?)?)),
            LogitsMode::ALL => ROption::RSome(into_tensor(tables.head(&h)?)),
            _ => ROption::RNone, // NONE (check() refused the rest)
        };
        // Its one layer's output (tap 0) is the hidden state itself.
        let taps = args.taps.iter().map(|_| into_tensor(h.clone())).collect();
        let hidden = if args.want_hidden { ROption::RSome(into_tensor(h)) } else { ROption::RNone };
        Ok(ForwardOutput { logits, hidden, taps })
    }
}

impl ModelGraph for Bigram {
    fn plan(&self) -> ModelPlan {
        self.plan.clone()
    }

    fn forward(&self, args: ForwardArgs<'_>, mut caches: RSliceMut<'_, CacheBox>) -> PResult<ForwardOutput> {
        if cfg!(feature = "forward-error") {
            return guard(|| {
                Err(PluginError::new(
                    ErrorCode::INTERNAL,
                    "toy-family forward failed on purpose (built with feature forward-error)",
                ))
            });
        }
        // Every boundary method runs inside a guard: a panic unwinding into
        // abi_stable's vtable would abort the host. `guard` takes
        // PluginErrors (with their codes); MLX's errors map to code MLX.
        guard(|| {
            self.check(&args, caches.len())?;
            #[cfg(feature = "faults")]
            faults::on_poison(&view(args.tokens));
            self.run(&args, &mut caches.as_mut_slice()[0]).map_err(mlx_error)
        })
    }

    fn embed(&self, tokens: TensorRef<'_>) -> PResult<Tensor> {
        guard_mlx(|| Ok(into_tensor(self.tables.lock().embed(&view(tokens))?)))
    }

    fn lm_head(&self, hidden: TensorRef<'_>) -> PResult<Tensor> {
        guard_mlx(|| Ok(into_tensor(self.tables.lock().head(&view(hidden))?)))
    }
}

/// The `skew-layout` variant: instead of `export_plugin!`, abi_stable's
/// `#[export_root_module]` exports a root module of the same prefix-type
/// shape as plugin-api's `PluginRoot` but with a field inserted before
/// `manifest` (declared in ../skewed-plugin-api). The host's abi_stable
/// layout check must refuse it before any entry is called.
#[cfg(feature = "skew-layout")]
mod skewed {
    use plugin_api::abi_stable::prefix_type::PrefixTypeTrait;
    use plugin_api::abi_stable::std_types::RStr;
    use plugin_api::*;
    use skewed_plugin_api::{PluginRoot, PluginRoot_Ref};

    extern "C" fn manifest() -> PResult<PluginManifest> {
        plugin_sdk::guard(|| Ok(super::manifest()))
    }

    extern "C" fn init(host: &HostInfo) -> PResult<()> {
        plugin_sdk::guard(|| super::init(host))
    }

    extern "C" fn plan_model(config: RStr<'_>) -> PResult<ModelPlan> {
        plugin_sdk::guard(|| super::plan_model(config.as_str()))
    }

    extern "C" fn open_model(args: &ModelOpenArgs) -> PResult<ModelBox> {
        plugin_sdk::guard(|| super::open_model(args))
    }

    #[abi_stable::export_root_module]
    pub fn root() -> PluginRoot_Ref {
        PluginRoot {
            abi_version: ABI_VERSION,
            build_flags: 0,
            manifest,
            init,
            plan_model: Some(plan_model),
            open_model: Some(open_model),
            new_cache: None,
            detect_draft: None,
            open_drafter: None,
        }
        .leak_into_prefix()
    }
}

/// The `faults` variant: what a broken plugin does to the process that
/// runs it, on purpose, when a poison token reaches forward (13 panics,
/// 14 aborts, 15 writes through a wild pointer).
#[cfg(feature = "faults")]
mod faults {
    pub fn on_poison(tokens: &mlx_rs::Array) {
        let ids: Vec<u32> = match tokens.as_dtype(mlx_rs::Dtype::Uint32) {
            Ok(t) => t.as_slice::<u32>().to_vec(),
            Err(_) => return,
        };
        if ids.contains(&13) {
            panic!("toy-family panics on token 13 (built with feature faults)");
        }
        if ids.contains(&14) {
            std::process::abort();
        }
        if ids.contains(&15) {
            // A wild write, as a broken plugin makes one: SIGSEGV.
            // SAFETY: none; this variant exists to crash its process.
            unsafe { std::ptr::write_volatile(std::ptr::without_provenance_mut::<u8>(16), 1) };
        }
    }
}
