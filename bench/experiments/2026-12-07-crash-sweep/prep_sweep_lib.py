"""What both PrepareData sweeps compare: the run's prepared dataset."""

import hashlib
import json

from smlt.runtime import keys
from smlt.runtime.store import S3Store


def dataset(w, desc):
    folder = json.loads(desc["output"])["prepared"]["dataset"].removeprefix(f"s3://{w.names.data_bucket}/")
    data = S3Store(w.names.data_bucket)
    objs = {k.removeprefix(folder): hashlib.sha256(data.get(k)).hexdigest()[:10] for k in data.list(folder)}
    m = json.loads(data.get(folder + keys.MANIFEST))
    objs.pop(keys.MANIFEST)
    return objs, (m["train"]["rows"], m["validation"]["rows"])
