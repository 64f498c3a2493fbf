//! One test binary for the whole end-to-end suite (matklad's layout): each
//! module is one area of the product.

mod admission;
mod agent_cache;
mod anthropic;
mod architecture;
mod bad_input;
mod batching;
mod batching_sliding;
mod bench_cmd;
mod checkpoint_shapes;
mod compiled_across_plugins;
mod embeddings;
mod exit_stress;
mod fim;
mod foundation;
mod http;
mod keepalive;
mod kv_quant;
mod limits;
mod memory;
mod page;
mod parity;
mod parity_gemma4;
mod parity_hybrid;
mod parity_moe;
mod plugins;
mod prefix_cache;
mod reasoning;
mod responses;
mod sampling_oracle;
mod speculation;
mod speculation_batched;
mod speculation_mtp;
mod speculation_scripted;
mod structured;
mod tools;
