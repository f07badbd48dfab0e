from tests.functional.store._fixtures import aws_env, redis_server, redis_store, s3_store, store  # noqa: F401
