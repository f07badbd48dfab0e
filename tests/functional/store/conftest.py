from tests.functional.store._fixtures import (  # noqa: F401
    aws_env,
    each_redis_server,
    redis_server,
    redis_store,
    redis_tls_server,
    s3_store,
    store,
)
