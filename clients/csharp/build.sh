#!/bin/sh
# Builds the binding and the example bot with mono's mcs:
#   build/Relay.Client.dll   (Runtime/*.cs)
#   build/Bot.exe            (examples/Bot.cs)
# Run the bot with the directory holding librelay_client.so on the loader path, e.g.
#   cmake -S ../c -B ../c/build && cmake --build ../c/build -j2
#   LD_LIBRARY_PATH=../c/build mono build/Bot.exe --server 127.0.0.1:7777 --room r --player p
# (mono maps DllImport("relay_client") to librelay_client.so; on macOS use DYLD_LIBRARY_PATH.)
# mcs accepts at most -langversion:7.2, which is a subset of the C# 7.3 that Unity needs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build}
MCS=${MCS:-mcs}
LANG_VERSION=${LANG_VERSION:-7.2}
mkdir -p "$out"
"$MCS" -nologo -target:library -langversion:"$LANG_VERSION" -unsafe -warnaserror -debug \
    -out:"$out/Relay.Client.dll" "$here"/Runtime/*.cs
"$MCS" -nologo -target:exe -langversion:"$LANG_VERSION" -warnaserror -debug \
    -r:"$out/Relay.Client.dll" -out:"$out/Bot.exe" "$here/examples/Bot.cs"
echo "built $out/Relay.Client.dll $out/Bot.exe"
