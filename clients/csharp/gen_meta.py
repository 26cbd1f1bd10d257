"""Writes the Unity .meta files of this package (git-URL packages are read-only: Unity ignores
assets without one). GUIDs derive from the path, so rerunning changes nothing.
Run after adding a file: python3 gen_meta.py"""
import hashlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"build"}
TAIL = "  externalObjects: {}\n  userData: \n  assetBundleName: \n  assetBundleVariant: \n"


def body(path: Path) -> str:
    if path.is_dir():
        return "folderAsset: yes\nDefaultImporter:\n" + TAIL
    if path.suffix == ".cs":
        return ("MonoImporter:\n  externalObjects: {}\n  serializedVersion: 2\n  defaultReferences: []\n"
                "  executionOrder: 0\n  icon: {instanceID: 0}\n  userData: \n  assetBundleName: \n"
                "  assetBundleVariant: \n")
    if path.suffix == ".asmdef":
        return "AssemblyDefinitionImporter:\n" + TAIL
    if path.name == "package.json":
        return "PackageManifestImporter:\n" + TAIL
    if path.suffix in (".md", ".json", ".txt"):
        return "TextScriptImporter:\n" + TAIL
    return "DefaultImporter:\n" + TAIL


def main() -> None:
    for path in sorted(HERE.rglob("*")):
        relative = path.relative_to(HERE)
        if relative.parts[0] in SKIP or path.suffix == ".meta" or any(
                part.startswith(".") or part.endswith("~") for part in relative.parts):
            continue
        if path.suffix in (".so", ".dll", ".dylib", ".a", ".bundle"):
            continue        # native plugins: Unity writes their metas with the platform settings
        guid = hashlib.md5(("com.relay.client/" + relative.as_posix()).encode()).hexdigest()
        meta = path.with_name(path.name + ".meta")
        meta.write_text(f"fileFormatVersion: 2\nguid: {guid}\n" + body(path))


if __name__ == "__main__":
    main()
