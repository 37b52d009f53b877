//! A `concord` binary with the rendezvous environment registered next to the built-in
//! ones: every command (`train`, `eval`, `envs`, `serve`, ...) finds it by name.
mod rendezvous;

fn main() {
    std::process::exit(concord::cli::main_with(vec![rendezvous::entry()]));
}
