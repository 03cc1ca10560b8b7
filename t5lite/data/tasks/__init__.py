"""Built-in tasks; importing a module registers its tasks."""
from t5lite.data.tasks import pretraining  # noqa: F401
from t5lite.data.tasks import glue  # noqa: F401
from t5lite.data.tasks import squad  # noqa: F401
from t5lite.data.tasks import wmt  # noqa: F401
from t5lite.data.tasks import summarization  # noqa: F401
from t5lite.data.tasks import superglue  # noqa: F401
from t5lite.data.tasks import family_pretraining  # noqa: F401
from t5lite.data.tasks import bert_finetune  # noqa: F401
from t5lite.data.tasks import tagging  # noqa: F401
from t5lite.data.tasks import text  # noqa: F401
from t5lite.data.tasks import sentence  # noqa: F401
from t5lite.data.tasks import multi30k_text  # noqa: F401
from t5lite.data.tasks import multilingual  # noqa: F401
from t5lite.data.tasks import gpt_finetune  # noqa: F401
from t5lite.data.tasks import images  # noqa: F401
from t5lite.data.tasks import symbolic  # noqa: F401
from t5lite.data.tasks import control  # noqa: F401
