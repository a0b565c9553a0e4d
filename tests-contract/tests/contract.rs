//! The contract suite instantiated for every engine and composite.
//! Adding a composite is one line.

mod mem_only {
    tests_contract::contract_suite!(tests_contract::MEM_ONLY);
    tests_contract::cache_suite!(tests_contract::MEM_ONLY);
    tests_contract::refs_suite!(tests_contract::MEM_ONLY);
}
mod kv_mem {
    tests_contract::contract_suite!(tests_contract::KV_MEM);
    tests_contract::cache_suite!(tests_contract::KV_MEM);
    tests_contract::refs_suite!(tests_contract::KV_MEM);
}
mod kv_sqlite {
    tests_contract::contract_suite!(tests_contract::KV_SQLITE);
    tests_contract::cache_suite!(tests_contract::KV_SQLITE);
    tests_contract::refs_suite!(tests_contract::KV_SQLITE);
}
mod sqlite_local {
    tests_contract::contract_suite!(tests_contract::SQLITE_LOCAL);
    tests_contract::cache_suite!(tests_contract::SQLITE_LOCAL);
    tests_contract::refs_suite!(tests_contract::SQLITE_LOCAL);
}
mod mem_local {
    tests_contract::contract_suite!(tests_contract::MEM_LOCAL);
    tests_contract::cache_suite!(tests_contract::MEM_LOCAL);
    tests_contract::refs_suite!(tests_contract::MEM_LOCAL);
}
mod mem_mem {
    tests_contract::contract_suite!(tests_contract::MEM_MEM);
    tests_contract::cache_suite!(tests_contract::MEM_MEM);
    tests_contract::refs_suite!(tests_contract::MEM_MEM);
}
mod kv_postgres {
    tests_contract::contract_suite!(tests_contract::KV_POSTGRES);
    tests_contract::cache_suite!(tests_contract::KV_POSTGRES);
    tests_contract::refs_suite!(tests_contract::KV_POSTGRES);
}
mod postgres_pglo {
    tests_contract::contract_suite!(tests_contract::POSTGRES_PGLO);
    tests_contract::cache_suite!(tests_contract::POSTGRES_PGLO);
    tests_contract::refs_suite!(tests_contract::POSTGRES_PGLO);
}
mod postgres_local {
    tests_contract::contract_suite!(tests_contract::POSTGRES_LOCAL);
    tests_contract::cache_suite!(tests_contract::POSTGRES_LOCAL);
    tests_contract::refs_suite!(tests_contract::POSTGRES_LOCAL);
}
mod sqlite_pglo {
    tests_contract::contract_suite!(tests_contract::SQLITE_PGLO);
    tests_contract::cache_suite!(tests_contract::SQLITE_PGLO);
    tests_contract::refs_suite!(tests_contract::SQLITE_PGLO);
}
mod mem_pglo {
    tests_contract::contract_suite!(tests_contract::MEM_PGLO);
    tests_contract::cache_suite!(tests_contract::MEM_PGLO);
    tests_contract::refs_suite!(tests_contract::MEM_PGLO);
}
mod sqlite_object_mem {
    tests_contract::contract_suite!(tests_contract::SQLITE_OBJECT_MEM);
    tests_contract::cache_suite!(tests_contract::SQLITE_OBJECT_MEM);
    tests_contract::refs_suite!(tests_contract::SQLITE_OBJECT_MEM);
}
mod mem_object_fs {
    tests_contract::contract_suite!(tests_contract::MEM_OBJECT_FS);
    tests_contract::cache_suite!(tests_contract::MEM_OBJECT_FS);
    tests_contract::refs_suite!(tests_contract::MEM_OBJECT_FS);
}
mod postgres_object_s3 {
    tests_contract::contract_suite!(tests_contract::POSTGRES_OBJECT_S3);
    tests_contract::cache_suite!(tests_contract::POSTGRES_OBJECT_S3);
    tests_contract::refs_suite!(tests_contract::POSTGRES_OBJECT_S3);
}
mod sqlite_local_layered {
    tests_contract::contract_suite!(tests_contract::SQLITE_LOCAL_LAYERED);
    tests_contract::cache_suite!(tests_contract::SQLITE_LOCAL_LAYERED);
    tests_contract::refs_suite!(tests_contract::SQLITE_LOCAL_LAYERED);
}
// The toy engine of docs/ENGINES.md ("Adding an engine"), both tiers.
mod example_example {
    tests_contract::contract_suite!("example+example", "example://", "example://");
}
