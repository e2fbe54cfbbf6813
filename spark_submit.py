"""``spark-submit --py-files replication-<version>-py3-none-any.whl spark_submit.py --pipeline
NAME --dir .``: the ``python -m replication spark`` job on a cluster (spark-submit runs a
script, not a module)."""

import sys

from replication.spark.runner import main

if __name__ == "__main__":
    sys.exit(main())
