//! Integration tests of the gateway (one test binary).

mod conformance;
mod fake_kernel_runs;
mod fuzz;
mod http_surface;
mod process;
mod real_kernel;
mod support;
