//! The macro that turns the table of settings in `sections.rs` into the
//! section structs, [`super::JobConfig`], the flags and the key list, so
//! that each setting is declared once.

/// Declares the job's sections. For each field: its doc (the key's and
/// the flag's help), extra clap attributes, the key, its type and default,
/// then `flag NAME: TYPE`, the flag's field (`--name-with-hyphens`) and the
/// type it parses; a flag sets the key with `Into` (`T` or `Option<T>`).
macro_rules! job_sections {
    (
        $(
            $(#[doc = $sdoc:literal])*
            [$section:ident] $Section:ident {
                $(
                    $(#[doc = $doc:literal])*
                    $(#[arg($($arg:tt)*)])*
                    $field:ident: $ty:ty = $default:expr, flag $flag:ident: $fty:ty;
                )*
            }
        )*
    ) => {
        $(
            $(#[doc = $sdoc])*
            #[derive(Clone, Debug, PartialEq, serde::Serialize)]
            pub struct $Section {
                $( $(#[doc = $doc])* pub $field: $ty, )*
            }

            impl Default for $Section {
                fn default() -> Self {
                    Self { $( $field: $default, )* }
                }
            }

            impl $Section {
                /// Sets `key` from a TOML value: `None` when this section
                /// has no such key, else the value's type error.
                fn set(&mut self, key: &str, value: toml::Value) -> Option<Result<(), String>> {
                    match key {
                        $(
                            stringify!($field) => Some(
                                value
                                    .try_into::<$ty>()
                                    .map(|v| self.$field = v)
                                    .map_err(|e| e.message().trim().to_string()),
                            ),
                        )*
                        _ => None,
                    }
                }
            }
        )*

        /// Every setting of a training job, by section: the TOML file of
        /// `ferrotron train --config` and, one flag per key, its command
        /// line. Defaults are the out-of-the-box run (the small GPT on the
        /// embedded corpus, about a minute on 2 CPU cores).
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
        pub struct JobConfig {
            $( $(#[doc = $sdoc])* pub $section: $Section, )*
        }

        impl JobConfig {
            /// Sets `section.key` from a TOML value: `None` when there is
            /// no such key, else the value's type error.
            pub(crate) fn set(&mut self, section: &str, key: &str, value: toml::Value) -> Option<Result<(), String>> {
                match section {
                    $( stringify!($section) => self.$section.set(key, value), )*
                    _ => None,
                }
            }
        }

        /// The flags of `ferrotron train` that set job keys (one per key of
        /// [`JobConfig`]); a flag given overrides the file.
        #[derive(clap::Args, Clone, Debug, Default)]
        pub struct JobFlags {
            $($(
                $(#[doc = $doc])*
                #[arg(long $(, $($arg)*)*)]
                pub $flag: Option<$fty>,
            )*)*
        }

        impl JobFlags {
            /// Overrides the keys of `config` whose flag was given; returns
            /// those keys.
            pub fn apply(self, config: &mut JobConfig) -> Vec<&'static Key> {
                let mut set = Vec::new();
                let mut keys = KEYS.iter();
                $($(
                    let key = keys.next().expect("one key per flag");
                    if let Some(v) = self.$flag {
                        config.$section.$field = v.into();
                        set.push(key);
                    }
                )*)*
                set
            }
        }

        impl JobConfig {
            /// The keys whose values differ between `self` and `was`, in
            /// the order of [`KEYS`], with both values.
            pub fn changes(&self, was: &JobConfig) -> Vec<Change> {
                let mut changed = Vec::new();
                let mut keys = KEYS.iter();
                $($(
                    let key = keys.next().expect("one key per field");
                    if self.$section.$field != was.$section.$field {
                        changed.push(Change::new(key, &was.$section.$field, &self.$section.$field));
                    }
                )*)*
                changed
            }
        }

        /// Every key of [`JobConfig`], in the order of the sections.
        pub const KEYS: &[Key] = &[
            $($( Key { section: stringify!($section), name: stringify!($field), flag_field: stringify!($flag) }, )*)*
        ];

        /// The section names, in order.
        pub const SECTIONS: &[&str] = &[ $( stringify!($section), )* ];
    };
}

pub(crate) use job_sections;
