//! Test kit: a scriptable fake A2A kernel, a scripted fake LLM for the real kernel, an SSE client
//! with stream invariants, and helpers to locate and configure the pinned real kernel.

pub mod fake_kernel;
pub mod fake_llm;
pub mod real_kernel;
pub mod sse;
pub mod synthetic_kernel;
