//! Prints the reference of every setting (`docs/guide/08-settings.md`):
//! `cargo run -p mscclpp-host --example settings_reference > docs/guide/08-settings.md`.

fn main() {
    print!("{}", mscclpp_host::settings::reference_markdown());
}
