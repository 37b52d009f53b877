fn main() {
    std::process::exit(concord::cli::main());
}
