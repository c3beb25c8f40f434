"""A wheel of a package's name and version that holds nothing else: what an installed package looks like to a
resolver (.ci/torch-kept).

    python .ci/stub_wheel.py NAME VERSION FOLDER
"""

import base64
import hashlib
import sys
import zipfile

name, version, folder = sys.argv[1:4]
info = f"{name}-{version}.dist-info"
files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
         f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: envlab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}


def digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


record = [f"{path},sha256={digest(text)},{len(text.encode())}" for path, text in files.items()]
files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
with zipfile.ZipFile(f"{folder}/{name}-{version}-py3-none-any.whl", "w") as wheel:
    for path, text in files.items():
        wheel.writestr(path, text)
